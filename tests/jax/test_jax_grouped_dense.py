"""fp8kit.jax.grouped_dense against fp8kit.jax.dense run on each expert's
tokens alone (bit for bit: the same per-expert casts and GEMMs), against
jax.lax.ragged_dot in high precision, and its argument checks; the grouped
custom calls themselves; the Flax module; sharded on two CPU devices; on a
GPU (pytest -m gpu) the bias gradient is the same bits on every run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8kit.jax as fj
from fp8kit.jax import _ffi_grouped
from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling, Format

import two_cpu_devices
from jax_gpus import gpus

RECIPE = CurrentScaling()
K, N = 32, 48


def _operands(sizes, dtype=jnp.bfloat16, kernel_dtype=None, seed=0, k=K, n=N):
    rng = np.random.default_rng(seed)
    e, t = len(sizes), sum(sizes)
    x = jnp.asarray(rng.standard_normal((t, k)), dtype)
    kernels = jnp.asarray(rng.standard_normal((e, k, n)) * 0.2, kernel_dtype or dtype)
    bias = jnp.asarray(rng.standard_normal((e, n)), dtype)
    dy = jnp.asarray(rng.standard_normal((t, n)), dtype)
    return x, kernels, bias, jnp.asarray(sizes, jnp.int32), dy


def _grouped_vjp(x, kernels, bias, sizes, dy, recipe=RECIPE):
    y, vjp = jax.vjp(lambda x, k, b: fj.grouped_dense(x, k, sizes, b, recipe=recipe), x,
                     kernels, bias)
    return (y, *vjp(dy))


def _dense_loop(x, kernels, bias, sizes, dy, recipe=RECIPE):
    """(y, dx, dk, db) from fp8kit.jax.dense on each expert's tokens; an
    expert with none gets zero gradients."""
    ys, dxs, dks, dbs = [], [], [], []
    starts = np.concatenate([[0], np.cumsum(np.asarray(sizes))])
    for e in range(kernels.shape[0]):
        s, t = int(starts[e]), int(starts[e + 1])
        if s == t:
            dks.append(jnp.zeros_like(kernels[e]))
            dbs.append(jnp.zeros_like(bias[e]))
            continue
        y, vjp = jax.vjp(lambda x, k, b: fj.dense(x, k, b, recipe=recipe), x[s:t], kernels[e],
                         bias[e])
        dx, dk, db = vjp(dy[s:t])
        ys.append(y)
        dxs.append(dx)
        dks.append(dk)
        dbs.append(db)
    return jnp.concatenate(ys), jnp.concatenate(dxs), jnp.stack(dks), jnp.stack(dbs)


def _assert_matches_dense(got, want):
    y, dx, dk, db = got
    assert y.dtype == want[0].dtype and dk.dtype == want[2].dtype
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(want[0], np.float32))
    np.testing.assert_array_equal(np.asarray(dx, np.float32), np.asarray(want[1], np.float32))
    np.testing.assert_array_equal(np.asarray(dk, np.float32), np.asarray(want[2], np.float32))
    # dense sums the bias gradient in its cast, grouped_dense in a one-hot
    # GEMM: float32 sums in another order, rounded to bias's dtype.
    tol = 1e-5 if db.dtype == jnp.float32 else 1e-2
    np.testing.assert_allclose(np.asarray(db, np.float32), np.asarray(want[3], np.float32),
                               rtol=tol, atol=tol * 10)


@pytest.mark.parametrize("dtype,kernel_dtype", [(jnp.bfloat16, None), (jnp.float32, None),
                                                (jnp.float16, None),
                                                (jnp.bfloat16, jnp.float32)])
def test_matches_dense_per_expert(dtype, kernel_dtype):
    args = _operands([10, 0, 37, 1, 16], dtype, kernel_dtype)
    _assert_matches_dense(_grouped_vjp(*args), _dense_loop(*args))


@pytest.mark.parametrize("recipe", [CurrentScaling(fp8_format=Format.E4M3, power_2_scale=True),
                                    CurrentScaling(amax_epsilon=1.0,
                                                   forward_fast_accumulation=True)])
def test_recipe_settings_match_dense(recipe):
    args = _operands([20, 12, 0], jnp.bfloat16, seed=3)
    _assert_matches_dense(_grouped_vjp(*args, recipe=recipe), _dense_loop(*args, recipe=recipe))


def test_single_group_and_jit():
    args = _operands([48], jnp.bfloat16, seed=1)
    got = jax.jit(_grouped_vjp)(*args)
    _assert_matches_dense(got, _dense_loop(*args))
    for a, b in zip(got, _grouped_vjp(*args)):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_empty_experts_get_zero_gradients():
    x, kernels, bias, sizes, dy = _operands([0, 30, 0, 2], jnp.float32, seed=2)
    _, _, dk, db = _grouped_vjp(x, kernels, bias, sizes, dy)
    for e in (0, 2):
        assert not np.asarray(dk[e]).any() and not np.asarray(db[e]).any()
    assert np.asarray(dk[1]).any() and np.asarray(dk[3]).any()


def test_close_to_ragged_dot():
    x, kernels, bias, sizes, dy = _operands([50, 3, 0, 75], jnp.float32, seed=4)
    y, dx, dk, _ = _grouped_vjp(x, kernels, bias, sizes, dy)
    hp = jax.lax.Precision.HIGHEST

    def ref(x, k):
        return jax.lax.ragged_dot(x, k, sizes, precision=hp)

    y_ref, vjp = jax.vjp(ref, x, kernels)
    experts = jnp.repeat(jnp.arange(4), sizes, total_repeat_length=x.shape[0])
    y_ref = y_ref + bias[experts]
    dx_ref, dk_ref = vjp(dy)
    for got, want in ((y, y_ref), (dx, dx_ref), (dk, dk_ref)):
        err = float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want))
        assert err < 0.08, err


def test_no_bias_and_no_tokens():
    x, kernels, _, sizes, dy = _operands([5, 11], jnp.bfloat16)
    y = fj.grouped_dense(x, kernels, sizes, recipe=RECIPE)
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(
        _dense_loop(x, kernels, jnp.zeros((2, N), x.dtype), sizes, dy)[0], np.float32))
    empty = jnp.zeros((0, K), jnp.float32)
    zeros = jnp.zeros((2,), jnp.int32)
    assert fj.grouped_dense(empty, kernels, zeros, recipe=RECIPE).shape == (0, N)
    dk = jax.jit(jax.grad(lambda k: fj.grouped_dense(empty, k, zeros, recipe=RECIPE).sum()))(
        kernels)
    assert dk.shape == kernels.shape and not np.asarray(dk, np.float32).any()


def test_vmap_matches_each_example():
    x, kernels, _, _, _ = _operands([20, 20], jnp.bfloat16)
    xs = jnp.stack([x, x[::-1]])
    sizes = jnp.asarray([[7, 33], [40, 0]], jnp.int32)

    def loss(x, s):
        return fj.grouped_dense(x, kernels, s, recipe=RECIPE).astype(jnp.float32).sum()

    grads = jax.vmap(jax.grad(loss))(xs, sizes)
    for i in range(2):
        np.testing.assert_array_equal(np.asarray(grads[i], np.float32),
                                      np.asarray(jax.grad(loss)(xs[i], sizes[i]), np.float32))


def test_int64_group_sizes():
    args = _operands([9, 23], jnp.bfloat16)
    want = _grouped_vjp(*args)
    with jax.enable_x64(True):
        sizes64 = jnp.asarray(np.asarray(args[3]), jnp.int64)
        assert sizes64.dtype == jnp.int64
        got = _grouped_vjp(*args[:3], sizes64, args[4])
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


# --- errors -----------------------------------------------------------------------------

def test_counts_that_do_not_sum_to_t():
    x, kernels, _, _, _ = _operands([10, 10])
    with pytest.raises(ValueError, match="group_sizes .* sum to 19 but x has 20 tokens"):
        fj.grouped_dense(x, kernels, jnp.asarray([10, 9], jnp.int32), recipe=RECIPE)
    with pytest.raises(ValueError, match="must be >= 0"):
        fj.grouped_dense(x, kernels, jnp.asarray([30, -10], jnp.int32), recipe=RECIPE)
    # Under jit the counts are not known while tracing: the core refuses them.
    call = jax.jit(lambda s: fj.grouped_dense(x, kernels, s, recipe=RECIPE))
    with pytest.raises(jax.errors.JaxRuntimeError, match="group_sizes sum to 19 but"):
        call(jnp.asarray([10, 9], jnp.int32)).block_until_ready()
    with pytest.raises(jax.errors.JaxRuntimeError, match="group_sizes sum to more than"):
        call(jnp.asarray([10, 11], jnp.int32)).block_until_ready()


@pytest.mark.parametrize("recipe,message", [(DelayedScaling(), "needs state="),
                                            (BlockScaling(), None),
                                            ("current", "recipe must be")])
def test_recipes_and_their_state(recipe, message):
    x, kernels, _, sizes, _ = _operands([4, 4])
    if message is None:  # stateless: runs (tests/jax/test_jax_grouped_recipes.py)
        assert fj.grouped_dense(x, kernels, sizes, recipe=recipe).shape == (8, N)
        return
    with pytest.raises(TypeError, match=message):
        fj.grouped_dense(x, kernels, sizes, recipe=recipe)


def test_argument_checks():
    x, kernels, bias, sizes, _ = _operands([8, 8])
    cases = [
        (ValueError, "x has shape", dict(x=x[None])),
        (ValueError, "kernels has shape", dict(kernels=kernels[0])),
        (ValueError, "x has 16 features", dict(x=x[:, :16])),
        (ValueError, "K=24 must be a positive multiple of 16",
         dict(x=x[:, :24], kernels=kernels[:, :24])),
        (ValueError, "N=40 must be a positive multiple of 16", dict(kernels=kernels[..., :40])),
        (TypeError, "x has dtype int32", dict(x=x.astype(jnp.int32))),
        (TypeError, "group_sizes has dtype float32", dict(group_sizes=sizes.astype(jnp.float32))),
        (TypeError, "group_sizes is a list; pass the counts", dict(group_sizes=[8, 8])),
        (ValueError, "group_sizes has shape \\(3,\\) but kernels holds 2 experts",
         dict(group_sizes=jnp.asarray([8, 8, 0], jnp.int32))),
        (ValueError, "bias has shape \\(48,\\)", dict(bias=bias[0])),
    ]
    for error, message, change in cases:
        args = dict(x=x, kernels=kernels, group_sizes=sizes, bias=bias)
        args.update(change)
        with pytest.raises(error, match=message):
            fj.grouped_dense(args["x"], args["kernels"], args["group_sizes"], args["bias"],
                             recipe=RECIPE)


# --- the custom calls -----------------------------------------------------------------------

def test_quantize_with_given_scales_and_defined_outputs():
    x, _, _, sizes, _ = _operands([5, 0, 27])
    operand = _ffi_grouped.sizes_operand(sizes)
    data, cw, scale, scale_inv, amax = _ffi_grouped.grouped_quantize_call(
        x, operand, "e4m3", True, True, 0.0, False)
    assert cw.shape == (K * _ffi_grouped.columnwise_tokens(32, 3),)
    for t in (scale, scale_inv, amax):  # only column 0 is a group's value
        assert t.shape == (3, _ffi_grouped.GROUP_SCALE_STRIDE) and not np.asarray(t[:, 1:]).any()
    assert float(scale[1, 0]) == 1.0 and float(amax[1, 0]) == 0.0  # the empty group
    given = _ffi_grouped.grouped_quantize_call(x, operand, "e4m3", True, True, 0.0, False,
                                               scale=scale)
    for a, b in zip(given[:4], (data, cw, scale, scale_inv)):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_custom_call_errors_name_the_operand():
    x, _, _, sizes, _ = _operands([8, 8])
    with pytest.raises(Exception, match="group_sizes must be int64 \\[E\\] or int32 \\[E, 2\\]"):
        _ffi_grouped.grouped_quantize_call(x, sizes, "e4m3", True, False, 0.0, False)


# --- Flax -----------------------------------------------------------------------------------

def test_flax_grouped_dense():
    flax = pytest.importorskip("flax")
    del flax
    from fp8kit.jax.flax import GroupedDense  # noqa: PLC0415  (needs the optional Flax)

    x, _, _, sizes, _ = _operands([12, 20, 0])
    model = GroupedDense(num_experts=3, features=N)
    variables = model.init(jax.random.PRNGKey(0), x, sizes)
    params = variables["params"]
    assert params["kernel"].shape == (3, K, N) and params["bias"].shape == (3, N)
    assert set(variables) == {"params"}
    y = model.apply(variables, x, sizes)
    want = fj.grouped_dense(x, params["kernel"], sizes, params["bias"], recipe=CurrentScaling())
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(want, np.float32))
    with pytest.raises(TypeError, match="recipe must be"):
        GroupedDense(num_experts=3, features=N, recipe="current")
    with pytest.raises(ValueError, match="num_experts"):
        GroupedDense(num_experts=0, features=N)


# --- sharding -------------------------------------------------------------------------------

def test_sharded_matches_unsharded_on_two_cpu_devices():
    out = two_cpu_devices.run("""
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
        import fp8kit.jax as fj
        from fp8kit.recipe import CurrentScaling

        rng = np.random.default_rng(0)
        x = jnp.asarray(rng.standard_normal((64, 32)), jnp.bfloat16)
        w = jnp.asarray(rng.standard_normal((4, 32, 48)), jnp.bfloat16)
        b = jnp.asarray(rng.standard_normal((4, 48)), jnp.bfloat16)
        sizes = jnp.asarray([10, 25, 0, 29], jnp.int32)  # groups straddle the two shards

        def step(x, w, b):
            y, vjp = jax.vjp(lambda x, w, b: fj.grouped_dense(x, w, sizes, b,
                                                              recipe=CurrentScaling()), x, w, b)
            return (y, *vjp(jnp.ones_like(y)))

        want = jax.jit(step)(x, w, b)
        for axes in (AxisType.Auto, AxisType.Explicit):
            mesh = jax.make_mesh((2,), ("d",), axis_types=(axes,))
            # data parallel (tokens sharded), then expert parallel (experts sharded)
            for xs, ws in ((P("d", None), P()), (P(), P("d", None, None))):
                with jax.set_mesh(mesh):
                    args = [jax.device_put(a, NamedSharding(mesh, s))
                            for a, s in ((x, xs), (w, ws), (b, P(*ws[:2])))]
                    got = jax.jit(step)(*args)
                same = all(np.array_equal(np.asarray(g, np.float32), np.asarray(r, np.float32))
                           for g, r in zip(got, want))
                print(axes, xs, ws, "same" if same else "DIFFERENT")
    """)
    lines = out.strip().splitlines()
    assert len(lines) == 4 and all(line.endswith(" same") for line in lines), out


@pytest.mark.gpu
@pytest.mark.skipif(not gpus(), reason="needs a CUDA GPU and fp8kit built with CUDA")
def test_the_bias_gradient_is_the_same_bits_on_every_run():
    # Thousands of rows per expert: a scatter-add's float atomics would
    # add them in a different order from run to run.
    x, kernels, bias, sizes, dy = _operands([3000, 0, 7000, 24], seed=9)
    step = jax.jit(lambda *a: _grouped_vjp(*a)[3])
    args = jax.device_put((x, kernels, bias, sizes, dy), gpus()[0])
    first = np.asarray(step(*args), np.float32)
    for _ in range(3):
        np.testing.assert_array_equal(np.asarray(step(*args), np.float32), first)
