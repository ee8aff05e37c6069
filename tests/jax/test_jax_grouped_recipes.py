"""fp8kit.jax.grouped_dense under DelayedScaling (one state per expert) and
BlockScaling (the padded row layout), bit for bit against fp8kit.jax.dense
run on each expert's tokens alone; the new custom calls' checks; Flax's
GroupedDense under both recipes; sharded on two CPU devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8kit.jax as fj
from fp8kit.jax import _ffi_grouped, _grouped_block
from fp8kit.jax.delayed_scaling import GRAD_OUTPUT
from fp8kit.recipe import AmaxReduction, BlockScaling, CurrentScaling, DelayedScaling, Format

import two_cpu_devices

K, N = 32, 48


def _operands(sizes, dtype=jnp.bfloat16, kernel_dtype=None, seed=0, k=K, n=N):
    rng = np.random.default_rng(seed)
    e, t = len(sizes), sum(sizes)
    x = jnp.asarray(rng.standard_normal((t, k)), dtype)
    kernels = jnp.asarray(rng.standard_normal((e, k, n)) * 0.2, kernel_dtype or dtype)
    bias = jnp.asarray(rng.standard_normal((e, n)), dtype)
    dy = jnp.asarray(rng.standard_normal((t, n)), dtype)
    return x, kernels, bias, jnp.asarray(sizes, jnp.int32), dy


def _bits(a):
    return np.asarray(a, np.float32)


def _assert_same(got, want, what):
    np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=what)


def _starts(sizes):
    return np.concatenate([[0], np.cumsum(np.asarray(sizes))]).astype(int)


# --- DelayedScaling ------------------------------------------------------------------------

def _grouped_step(recipe, x, kernels, bias, sizes, dy, state):
    """(y, dx, dk, db, new state) of one differentiated grouped_dense call."""
    y, vjp = jax.vjp(lambda x, k, b, s: fj.grouped_dense(x, k, sizes, b, state=s, recipe=recipe),
                     x, kernels, bias, state)
    return (y, *vjp(dy))


def _dense_step(recipe, x, kernels, bias, sizes, dy, states):
    """The same step as one fp8kit.jax.dense per expert with its own state.
    An expert with no tokens runs dense on none, but keeps its output
    gradient's state as it was: grouped_dense follows fp8kit.torch's
    Linear, which casts no output gradient without tokens (jax's dense
    records an amax of 0 for it)."""
    starts = _starts(sizes)
    ys, dxs, dks, dbs, new = [], [], [], [], []
    for e, state in enumerate(states):
        s, t = starts[e], starts[e + 1]
        y, vjp = jax.vjp(lambda x, k, b, st: fj.dense(x, k, b, state=st, recipe=recipe),
                         x[s:t], kernels[e], bias[e], state)
        dx, dk, db, st = vjp(dy[s:t])
        if s == t:
            st = jax.tree.map(lambda a, old: a.at[GRAD_OUTPUT].set(old[GRAD_OUTPUT]), st, state)
        ys.append(y)
        dxs.append(dx)
        dks.append(dk)
        dbs.append(db)
        new.append(st)
    return (jnp.concatenate(ys), jnp.concatenate(dxs), jnp.stack(dks), jnp.stack(dbs)), new


def _assert_state_is_experts(state, states):
    for e, st in enumerate(states):
        for field in ("amax_history", "scale", "seeded"):
            _assert_same(getattr(state.expert(e), field), getattr(st, field),
                         f"expert {e} {field}")


@pytest.mark.parametrize("recipe,dtype", [
    (DelayedScaling(amax_history_len=4), jnp.bfloat16),
    (DelayedScaling(fp8_format=Format.E4M3, margin=1, amax_history_len=2,
                    amax_reduction=AmaxReduction.MOST_RECENT), jnp.float32),
])
def test_delayed_matches_dense_per_expert_over_steps(recipe, dtype):
    steps = [[10, 0, 37, 1], [5, 20, 0, 16], [0, 12, 9, 3]]  # each expert empty in some step
    state = fj.GroupedDelayedScalingState.create(recipe, 4)
    states = [fj.DelayedScalingState.create(recipe) for _ in range(4)]
    step = jax.jit(_grouped_step, static_argnums=0)
    for i, sizes in enumerate(steps):
        x, kernels, bias, sizes, dy = _operands(sizes, dtype, seed=i)
        *got, state = step(recipe, x, kernels, bias, sizes, dy, state)
        want, states = _dense_step(recipe, x, kernels, bias, sizes, dy, states)
        for name, g, w in zip(("y", "dx", "dk"), got, want):
            _assert_same(g, w, f"step {i} {name}")
        np.testing.assert_allclose(_bits(got[3]), _bits(want[3]), rtol=1e-2, atol=1e-1)
        _assert_state_is_experts(state, states)


def test_delayed_empty_expert_keeps_its_output_gradient_state():
    recipe = DelayedScaling(amax_history_len=3)
    x, kernels, bias, sizes, dy = _operands([7, 9], seed=5)
    *_, state = _grouped_step(recipe, x, kernels, bias, sizes, dy,
                              fj.GroupedDelayedScalingState.create(recipe, 2))
    x, _, _, sizes, dy = _operands([16, 0], seed=6)
    *_, new = _grouped_step(recipe, x, kernels, bias, sizes, dy, state)
    old_g, new_g = state.expert(1), new.expert(1)
    _assert_same(new_g.amax_history[GRAD_OUTPUT], old_g.amax_history[GRAD_OUTPUT], "history")
    _assert_same(new_g.scale[GRAD_OUTPUT], old_g.scale[GRAD_OUTPUT], "scale")
    # its input recorded amax 0 (rolled in, the scale kept)
    assert float(new_g.amax_history[0, 0]) == 0.0
    _assert_same(new_g.amax_history[0, 1:], old_g.amax_history[0, :-1], "input history")


def test_delayed_inference_records_nothing_and_casts_with_the_state():
    recipe = DelayedScaling(amax_history_len=4)
    x, kernels, bias, sizes, dy = _operands([12, 0, 20], seed=7)
    *_, state = _grouped_step(recipe, x, kernels, bias, sizes, dy,
                              fj.GroupedDelayedScalingState.create(recipe, 3))
    x2 = x * 3  # other amaxes: a recording cast would scale differently
    call = jax.jit(lambda x, s: fj.grouped_dense(x, kernels, sizes, bias, state=s, recipe=recipe))
    y = call(x2, state)
    starts = _starts(sizes)
    for e in range(3):
        s, t = starts[e], starts[e + 1]
        want = fj.dense(x2[s:t], kernels[e], bias[e], state=state.expert(e), recipe=recipe)
        _assert_same(y[s:t], want, f"expert {e}")


def test_delayed_no_tokens_records_inputs_only():
    recipe = DelayedScaling(amax_history_len=2)
    _, kernels, bias, _, _ = _operands([4, 4])
    x = jnp.zeros((0, K), jnp.bfloat16)
    sizes = jnp.zeros((2,), jnp.int32)
    state = fj.GroupedDelayedScalingState.create(recipe, 2)
    y, dx, dk, db, new = _grouped_step(recipe, x, kernels, bias, sizes,
                                       jnp.zeros((0, N), jnp.bfloat16), state)
    assert y.shape == (0, N) and dx.shape == (0, K) and not _bits(dk).any()
    assert not _bits(db).any()
    for e in range(2):
        assert float(new.seeded[e, 0]) == 1.0 and float(new.seeded[e, 1]) == 1.0
        assert float(new.seeded[e, GRAD_OUTPUT]) == 0.0  # no output gradient was cast
        assert float(new.amax_history[e, 1, 0]) == float(jnp.max(jnp.abs(
            kernels[e].astype(jnp.float32))))


def test_delayed_state_checks():
    recipe = DelayedScaling(amax_history_len=4)
    x, kernels, _, sizes, _ = _operands([4, 4])
    with pytest.raises(TypeError, match="needs state=GroupedDelayedScalingState.create"):
        fj.grouped_dense(x, kernels, sizes, recipe=recipe)
    with pytest.raises(ValueError, match=r"state.amax_history has shape \(3, 3, 4\)"):
        fj.grouped_dense(x, kernels, sizes, recipe=recipe,
                         state=fj.GroupedDelayedScalingState.create(recipe, 3))
    with pytest.raises(TypeError, match="CurrentScaling is stateless"):
        fj.grouped_dense(x, kernels, sizes, recipe=CurrentScaling(),
                         state=fj.GroupedDelayedScalingState.create(recipe, 2))
    with pytest.raises(TypeError, match="GroupedDelayedScalingState.create"):
        fj.grouped_dense(x, kernels, sizes, recipe=recipe,
                         state=fj.DelayedScalingState.create(recipe))
    bad = fj.GroupedDelayedScalingState.create(recipe, 2)
    with pytest.raises(ValueError, match="scale holds 0"):
        fj.GroupedDelayedScalingState.from_arrays(bad.amax_history, bad.scale * 0, bad.seeded)
    with pytest.raises(ValueError, match="scale holds 0"):
        fj.grouped_dense(x, kernels, sizes, recipe=recipe,
                         state=fj.GroupedDelayedScalingState(bad.amax_history, bad.scale * 0,
                                                             bad.seeded))


def test_delayed_second_use_in_one_step_is_refused():
    recipe = DelayedScaling()
    x, kernels, _, sizes, _ = _operands([4, 4])

    def loss(state):
        y = fj.grouped_dense(x, kernels, sizes, state=state, recipe=recipe)
        return (y + fj.grouped_dense(x, kernels, sizes, state=state, recipe=recipe)).sum()

    with pytest.raises(ValueError, match="already used"):
        jax.grad(loss)(fj.GroupedDelayedScalingState.create(recipe, 2))


# --- BlockScaling --------------------------------------------------------------------------

def _block_vjp(recipe, x, kernels, bias, sizes, dy):
    y, vjp = jax.vjp(lambda x, k, b: fj.grouped_dense(x, k, sizes, b, recipe=recipe), x,
                     kernels, bias)
    return (y, *vjp(dy))


def _block_dense_loop(recipe, x, kernels, bias, sizes, dy):
    starts = _starts(sizes)
    ys, dxs, dks, dbs = [], [], [], []
    for e in range(kernels.shape[0]):
        s, t = starts[e], starts[e + 1]
        if s == t:
            dks.append(jnp.zeros_like(kernels[e]))
            dbs.append(jnp.zeros_like(bias[e]))
            continue
        y, vjp = jax.vjp(lambda x, k, b: fj.dense(x, k, b, recipe=recipe), x[s:t], kernels[e],
                         bias[e])
        dx, dk, db = vjp(dy[s:t])
        ys += [y]
        dxs += [dx]
        dks += [dk]
        dbs += [db]
    return jnp.concatenate(ys), jnp.concatenate(dxs), jnp.stack(dks), jnp.stack(dbs)


def _assert_block_matches(got, want):
    for name, g, w in zip(("y", "dx", "dk"), got, want):
        assert g.dtype == w.dtype, name
        _assert_same(g, w, name)
    # dense sums the bias gradient over its tokens, grouped_dense in a
    # one-hot GEMM: float32 sums in another order.
    np.testing.assert_allclose(_bits(got[3]), _bits(want[3]), rtol=1e-2, atol=1e-1)


@pytest.mark.parametrize("dtype,kernel_dtype", [(jnp.bfloat16, None), (jnp.float32, None),
                                                (jnp.float16, None),
                                                (jnp.bfloat16, jnp.float32)])
def test_block_matches_dense_per_expert(dtype, kernel_dtype):
    args = _operands([10, 0, 37, 1, 16], dtype, kernel_dtype)
    recipe = BlockScaling()
    _assert_block_matches(_block_vjp(recipe, *args), _block_dense_loop(recipe, *args))


def test_block_several_tiles_per_expert_and_recipe_settings():
    # 130 tokens: two 128-token tiles of the columnwise copies; K and N
    # cross a 128-wide block.
    recipe = BlockScaling(fp8_format=Format.HYBRID, power_2_scale=False, amax_epsilon=1e-3)
    args = _operands([130, 0, 17], jnp.bfloat16, seed=8, k=144, n=160)
    _assert_block_matches(_block_vjp(recipe, *args), _block_dense_loop(recipe, *args))


def test_block_jit_grad_and_empty_layer():
    recipe = BlockScaling()
    x, kernels, bias, sizes, _ = _operands([0, 40, 0, 9], jnp.bfloat16, seed=9)

    def loss(x, k, b):
        return fj.grouped_dense(x, k, sizes, b, recipe=recipe).astype(jnp.float32).sum()

    got = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(x, kernels, bias)
    want = _block_dense_loop(recipe, x, kernels, bias, sizes,
                             jnp.ones((x.shape[0], N), jnp.bfloat16))
    _assert_same(got[0], want[1], "dx")
    _assert_same(got[1], want[2], "dk")
    for e in (0, 2):
        assert not _bits(got[1][e]).any()
    empty = jnp.zeros((0, K), jnp.float32)
    zeros = jnp.zeros((4,), jnp.int32)
    assert fj.grouped_dense(empty, kernels, zeros, recipe=recipe).shape == (0, N)
    dk = jax.grad(lambda k: fj.grouped_dense(empty, k, zeros, recipe=recipe).sum())(kernels)
    assert not _bits(dk).any()


def test_padded_rows_place_each_expert_at_its_padded_offset():
    rows, dest = _grouped_block.padded_rows(jnp.asarray([3, 0, 17, 16], jnp.int32), 36)
    assert rows == 36 + 15 * 4
    want = [*range(0, 3), *range(16, 33), *range(48, 64)]
    assert np.asarray(dest).tolist() == want


def test_block_quantize_call_checks_its_scales():
    x, _, _, sizes, _ = _operands([5, 11])
    rows = 16 + 15 * 2
    xp = jnp.zeros((rows, K), x.dtype)
    operand = _ffi_grouped.sizes_operand(sizes)
    data, cw, s, cs = _ffi_grouped.grouped_quantize_block_call(
        xp, operand, "e4m3", True, True, "block_1x128", 0.0, True, 16)
    assert data.shape == (rows, K) and cw.shape == (K, rows)
    assert s.size == _ffi_grouped.block_scales_floats(rows, 2, K, "block_1x128", False)
    with pytest.raises(Exception, match="scaling_mode must be a block mode"):
        _ffi_grouped.grouped_quantize_block_call(xp, operand, "e4m3", True, True, "per_tensor",
                                                 0.0, True, 16)
    # The padded rows fit sizes summing to 17 too: only the real rows tell.
    with pytest.raises(Exception, match="group_sizes sum to 16 but the input has 17 rows"):
        _ffi_grouped.grouped_quantize_block_call(xp, operand, "e4m3", True, True, "block_1x128",
                                                 0.0, True, 17)


@pytest.mark.parametrize("recipe", [CurrentScaling(), BlockScaling(), DelayedScaling()],
                         ids=["current", "block", "delayed"])
def test_traced_counts_that_do_not_sum_to_the_tokens_are_refused(recipe):
    # Under jit the counts are traced, so the Python check cannot see them:
    # each recipe's first custom call refuses them (block scaling's pads the
    # tokens first, and the padded rows fit wrong counts as well).
    x, kernels, _, _, _ = _operands([5, 11])
    state = fj.GroupedDelayedScalingState.create(recipe, 2) \
        if isinstance(recipe, DelayedScaling) else None
    step = jax.jit(lambda sizes: fj.grouped_dense(x, kernels, sizes, recipe=recipe, state=state))
    with pytest.raises(Exception, match="group_sizes sum to 15 but the input has 16 rows"):
        jax.block_until_ready(step(jnp.asarray([5, 10], jnp.int32)))


# --- Flax ----------------------------------------------------------------------------------

def test_flax_grouped_dense_recipes():
    pytest.importorskip("flax")
    from flax import serialization  # noqa: PLC0415  (the optional Flax)
    from fp8kit.jax.flax import GroupedDense  # noqa: PLC0415

    x, _, _, sizes, _ = _operands([12, 20, 0])
    block = GroupedDense(num_experts=3, features=N, recipe=BlockScaling())
    variables = block.init(jax.random.PRNGKey(0), x, sizes)
    assert set(variables) == {"params"}
    p = variables["params"]
    _assert_same(block.apply(variables, x, sizes),
                 fj.grouped_dense(x, p["kernel"], sizes, p["bias"], recipe=BlockScaling()),
                 "block")

    recipe = DelayedScaling(amax_history_len=4)
    model = GroupedDense(num_experts=3, features=N, recipe=recipe)
    variables = model.init(jax.random.PRNGKey(0), x, sizes)
    state = variables["fp8_state"]["scaling"]
    assert isinstance(state, fj.GroupedDelayedScalingState) and state.scale.shape == (3, 3)

    def loss(params, fp8_state):
        y = model.apply({"params": params, "fp8_state": fp8_state}, x, sizes)
        return y.astype(jnp.float32).sum()

    _, new = jax.grad(loss, argnums=(0, 1))(variables["params"], variables["fp8_state"])
    want = _grouped_step(recipe, x, variables["params"]["kernel"], variables["params"]["bias"],
                         sizes, jnp.ones((32, N), x.dtype), state)[-1]
    _assert_same(new["scaling"].scale, want.scale, "flax state")
    restored = serialization.from_bytes(variables, serialization.to_bytes(
        {"params": variables["params"], "fp8_state": new}))
    _assert_same(restored["fp8_state"]["scaling"].amax_history, want.amax_history, "restored")


# --- sharding ------------------------------------------------------------------------------

def test_sharded_recipes_match_unsharded_on_two_cpu_devices():
    out = two_cpu_devices.run("""
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
        import fp8kit.jax as fj
        from fp8kit.recipe import BlockScaling, DelayedScaling

        rng = np.random.default_rng(0)
        x = jnp.asarray(rng.standard_normal((64, 32)), jnp.bfloat16)
        w = jnp.asarray(rng.standard_normal((4, 32, 48)), jnp.bfloat16)
        sizes = jnp.asarray([10, 25, 0, 29], jnp.int32)
        delayed = DelayedScaling(amax_history_len=4)
        state = fj.GroupedDelayedScalingState.create(delayed, 4)

        def step(recipe, x, w, s):
            y, vjp = jax.vjp(lambda x, w, s: fj.grouped_dense(x, w, sizes, state=s,
                                                              recipe=recipe), x, w, s)
            return (y, *jax.tree.leaves(vjp(jnp.ones_like(y))))

        for recipe, s in ((delayed, state), (BlockScaling(), None)):
            want = jax.jit(step, static_argnums=0)(recipe, x, w, s)
            for axes in (AxisType.Auto, AxisType.Explicit):
                mesh = jax.make_mesh((2,), ("d",), axis_types=(axes,))
                with jax.set_mesh(mesh):
                    xs = jax.device_put(x, NamedSharding(mesh, P("d", None)))
                    ws = jax.device_put(w, NamedSharding(mesh, P("d", None, None)))
                    got = jax.jit(step, static_argnums=0)(recipe, xs, ws, s)
                same = all(np.array_equal(np.asarray(g, np.float32), np.asarray(r, np.float32))
                           for g, r in zip(got, want))
                print(type(recipe).__name__, axes, "same" if same else "DIFFERENT")
    """)
    lines = out.strip().splitlines()
    assert len(lines) == 4 and all(line.endswith(" same") for line in lines), out
