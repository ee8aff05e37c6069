"""grouped_dense's statistics rows: each tensor's row is the merge over the
experts of the statistics of each expert's own cast (by the public
quantizers and fp8kit.jax.cast_statistics: amax the largest, counts and
element numbers added, sums added up to float32 rounding), with an expert
given no tokens and counts that are not multiples of 16, under current,
delayed (a fresh state's first step casts as current scaling does) and
block scaling, with counts traced under jit; the rows change no result;
under a mesh (tokens or experts sharded) they are the unsharded call's;
bad rows and a call inside shard_map are refused; on a GPU (pytest -m gpu)
the rows are the CPU's (amax and counts bit for bit, sums within the
statistics header's 1e-5)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import two_cpu_devices
from jax.sharding import PartitionSpec as P

import fp8kit.jax as fj
from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling
from jax_gpus import gpus

COUNTS = [5, 0, 27, 16]
E, K, N = len(COUNTS), 256, 32
RECIPES = {"current": CurrentScaling(), "delayed": DelayedScaling(), "block": BlockScaling()}


def _arrays():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((sum(COUNTS), K)).astype(np.float32)
    x[3, :7] *= 1e-6  # values that flush to zero
    x[30, 0] = 1e4    # one that makes the rest of its expert's small
    kernels = rng.standard_normal((E, K, N)).astype(np.float32) * 0.05
    dy = rng.standard_normal((sum(COUNTS), N)).astype(np.float32)
    return (jnp.asarray(x, jnp.bfloat16), jnp.asarray(kernels, jnp.bfloat16),
            jnp.asarray(dy, jnp.bfloat16))


def _state(recipe):
    if isinstance(recipe, DelayedScaling):
        return fj.GroupedDelayedScalingState.create(recipe, E)
    return None


def _cast_stats(t, fmt, block_mode):
    if block_mode is None:
        scaled, _ = fj.quantize_current_scaling(t, fmt)
    else:
        scaled = fj.quantize_block_scaling(t, fmt, scaling_mode=block_mode)
    s = fj.cast_statistics(t, scaled)
    return (float(s.amax), int(s.underflow), int(s.saturated), float(s.error_sq),
            float(s.norm_sq), t.size)


def _merged(parts):
    return (max(p[0] for p in parts), sum(p[1] for p in parts), sum(p[2] for p in parts),
            sum(p[3] for p in parts), sum(p[4] for p in parts), sum(p[5] for p in parts))


def _expected(recipe, x, kernels, dy):
    block = isinstance(recipe, BlockScaling)
    rows_mode, kernel_mode = ("block_1x128", "block_128x128") if block else (None, None)
    grad_fmt = "e4m3" if block else "e5m2"
    starts = np.cumsum([0] + COUNTS)
    tokens = [(starts[e], starts[e + 1]) for e in range(E) if COUNTS[e]]
    return {"input": _merged([_cast_stats(x[a:b], "e4m3", rows_mode) for a, b in tokens]),
            "weight": _merged([_cast_stats(kernels[e], "e4m3", kernel_mode) for e in range(E)]),
            "grad_output": _merged([_cast_stats(dy[a:b], grad_fmt, rows_mode)
                                    for a, b in tokens])}


def _rows(recipe, x, kernels, dy, device=None):
    """The filled rows of one jitted step on `device` (default: the CPU),
    the counts traced."""
    state = _state(recipe)
    device = device or jax.devices("cpu")[0]

    @jax.jit
    def rows_of(x, kernels, dy, counts, state, rows):
        def f(x, kernels, rows):
            return fj.grouped_dense(x, kernels, counts, state=state, recipe=recipe,
                                    statistics=rows)
        _, vjp = jax.vjp(f, x, kernels, rows)
        return vjp(dy)[2]

    args = (x, kernels, dy, jnp.asarray(COUNTS, jnp.int32), state, fj.statistics_rows(1))
    return rows_of(*jax.device_put(args, device))


@pytest.mark.parametrize("recipe", list(RECIPES), ids=list(RECIPES))
def test_rows_are_the_experts_casts_merged(recipe):
    recipe = RECIPES[recipe]
    x, kernels, dy = _arrays()
    rows = _rows(recipe, x, kernels, dy)
    got = {s.role: s for s in fj.tensor_statistics(rows, "experts")}
    for role, want in _expected(recipe, x, kernels, dy).items():
        g = got[role]
        assert g.scale is None, role  # a scale per expert: no one scale
        assert (g.amax, g.underflow, g.saturated, g.numel) == \
            (want[0], want[1], want[2], want[5]), role
        np.testing.assert_allclose([g.error_sq, g.norm_sq], [want[3], want[4]], rtol=1e-5,
                                   err_msg=role)
    assert got["input"].underflow > 0


@pytest.mark.parametrize("recipe", list(RECIPES), ids=list(RECIPES))
def test_rows_change_no_result(recipe):
    recipe = RECIPES[recipe]
    x, kernels, dy = _arrays()
    counts = jnp.asarray(COUNTS, jnp.int32)

    def loss(x, kernels, state, rows):
        y = fj.grouped_dense(x, kernels, counts, state=state, recipe=recipe, statistics=rows)
        return jnp.sum(y.astype(jnp.float32) * dy.astype(jnp.float32))

    args = (x, kernels, _state(recipe))
    plain = jax.jit(jax.grad(lambda *a: loss(*a, None), argnums=(0, 1, 2)))(*args)
    seen = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*args, fj.statistics_rows(1))
    for a, b in zip(jax.tree_util.tree_leaves(plain), jax.tree_util.tree_leaves(seen)):
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_kernels_whose_k_is_no_multiple_of_128_are_read_per_expert():
    recipe = BlockScaling()
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.standard_normal((20, 144)), jnp.bfloat16)
    kernels = jnp.asarray(rng.standard_normal((2, 144, 32)) * 0.05, jnp.bfloat16)
    _, vjp = jax.vjp(lambda rows: fj.grouped_dense(x, kernels, jnp.asarray([8, 12], jnp.int32),
                                                   recipe=recipe, statistics=rows),
                     fj.statistics_rows(1))
    (rows,) = vjp(jnp.ones((20, 32), jnp.bfloat16))
    got = {s.role: s for s in fj.tensor_statistics(rows, "experts")}["weight"]
    want = _merged([_cast_stats(kernels[e], "e4m3", "block_128x128") for e in range(2)])
    assert (got.amax, got.underflow, got.saturated, got.numel) == \
        (want[0], want[1], want[2], want[5])
    np.testing.assert_allclose([got.error_sq, got.norm_sq], [want[3], want[4]], rtol=1e-5)


def test_rows_under_a_mesh_are_the_unsharded_calls():
    # Tokens or experts split over two devices, Auto and Explicit axes: the
    # rows are the whole layer's. XLA's host device count is fixed when jax
    # starts: a child process.
    out = two_cpu_devices.run("""
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
        import fp8kit.jax as fj
        from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling
        rng = np.random.default_rng(0)
        x = jnp.asarray(rng.standard_normal((64, 128)), jnp.bfloat16)
        w = jnp.asarray(rng.standard_normal((4, 128, 48)) * 0.05, jnp.bfloat16)
        sizes = jnp.asarray([10, 25, 0, 29], jnp.int32)  # groups straddle the shards
        for recipe in (CurrentScaling(), DelayedScaling(), BlockScaling()):
            state = (fj.GroupedDelayedScalingState.create(recipe, 4)
                     if isinstance(recipe, DelayedScaling) else None)
            def rows(x, w):
                def loss(x, w, rows):
                    y = fj.grouped_dense(x, w, sizes, state=state, recipe=recipe,
                                         statistics=rows)
                    return jnp.sum(y.astype(jnp.float32) ** 2)
                return jax.jit(jax.grad(loss, argnums=2))(x, w, fj.statistics_rows(1))
            want = np.asarray(rows(x, w))
            for axes in (AxisType.Auto, AxisType.Explicit):
                mesh = jax.make_mesh((2,), ("d",), axis_types=(axes,))
                for xs, ws in ((P("d", None), P()), (P(), P("d", None, None))):
                    with jax.set_mesh(mesh):
                        got = rows(jax.device_put(x, NamedSharding(mesh, xs)),
                                   jax.device_put(w, NamedSharding(mesh, ws)))
                    print(np.array_equal(np.asarray(got), want, equal_nan=True))
        """)
    assert out.split() == ["True"] * 12, out


def test_bad_rows_and_shard_map_are_refused():
    x, kernels, _ = _arrays()
    counts = jnp.asarray(COUNTS, jnp.int32)
    with pytest.raises(ValueError, match=r"statistics_rows\(1\)"):
        fj.grouped_dense(x, kernels, counts, recipe=CurrentScaling(),
                         statistics=fj.statistics_rows(2))
    mesh = jax.make_mesh((1,), ("e",))
    local = jax.shard_map(
        lambda x: fj.grouped_dense(x, kernels, counts, recipe=CurrentScaling(),
                                   statistics=fj.statistics_rows(1)),
        mesh=mesh, in_specs=P("e"), out_specs=P("e"))
    with pytest.raises(ValueError, match="inside jax.shard_map"):
        local(jax.device_put(x, jax.sharding.NamedSharding(mesh, P("e"))))


@pytest.mark.gpu
@pytest.mark.skipif(not gpus(), reason="needs a CUDA GPU and fp8kit built with CUDA")
@pytest.mark.parametrize("recipe", list(RECIPES), ids=list(RECIPES))
def test_gpu_rows_are_the_cpus(recipe):
    recipe = RECIPES[recipe]
    if isinstance(recipe, BlockScaling) and not fj.supports_block_scaled_fp8_gemm(gpus()[0]):
        pytest.skip("this GPU runs no block-scaled FP8 GEMM")
    arrays = _arrays()
    cpu = fj.tensor_statistics(_rows(recipe, *arrays), "experts")
    gpu = fj.tensor_statistics(_rows(recipe, *arrays, gpus()[0]), "experts")
    for c, g in zip(cpu, gpu):
        assert (g.role, g.amax, g.underflow, g.saturated, g.numel) == \
            (c.role, c.amax, c.underflow, c.saturated, c.numel)
        np.testing.assert_allclose([g.error_sq, g.norm_sq], [c.error_sq, c.norm_sq], rtol=1e-5)
