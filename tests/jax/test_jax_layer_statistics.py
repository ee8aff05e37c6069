"""The layers' statistics rows (fp8kit.jax.statistics_rows): what dense,
layernorm_dense and layernorm_mlp record of their casts when asked, read
back by tensor_statistics; the same gradients with the rows as without."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import two_cpu_devices

import fp8kit.jax as fj
from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling

RECIPES = [DelayedScaling(), CurrentScaling(), BlockScaling()]
M, K, N = 48, 128, 256


def _arrays(seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.bfloat16)
    k = jnp.asarray(rng.standard_normal((K, N)) * 0.05, jnp.bfloat16)
    dy = jnp.asarray(rng.standard_normal((M, N)), jnp.bfloat16)
    return x, k, dy


def _state(recipe, num_linears=1):
    if isinstance(recipe, DelayedScaling):
        return fj.DelayedScalingState.create(recipe, num_linears=num_linears)
    return None


def _expected(t, fmt, block_mode=None):
    """The statistics of the recipe's cast of t, by the public ops."""
    if block_mode is None:
        scaled, _ = fj.quantize_current_scaling(t, fmt)
    else:
        scaled = fj.quantize_block_scaling(t, fmt, scaling_mode=block_mode)
    return fj.cast_statistics(t, scaled)


def _by_role(rows, layer="proj"):
    return {s.role: s for s in fj.tensor_statistics(rows, layer)}


@pytest.mark.parametrize("recipe", [CurrentScaling(), BlockScaling()], ids=["current", "block"])
def test_dense_rows_are_the_statistics_of_its_casts(recipe):
    x, k, dy = _arrays()
    _, vjp = jax.vjp(lambda rows: fj.dense(x, k, recipe=recipe, statistics=rows),
                     fj.statistics_rows(1))
    (rows,) = vjp(dy)
    got = _by_role(rows)
    block = isinstance(recipe, BlockScaling)
    want = {"input": _expected(x, "e4m3", "block_1x128" if block else None),
            "weight": _expected(k, "e4m3", "block_128x128" if block else None),
            # BlockScaling casts gradients to E4M3 too (fp8kit.recipe).
            "grad_output": _expected(dy, "e4m3" if block else "e5m2",
                                     "block_1x128" if block else None)}
    for role, w in want.items():
        g = got[role]
        assert g.amax == float(w.amax), role
        assert (g.underflow, g.saturated) == (int(w.underflow), int(w.saturated)), role
        np.testing.assert_allclose([g.error_sq, g.norm_sq], [float(w.error_sq), float(w.norm_sq)],
                                   rtol=1e-6, err_msg=role)
    assert (got["input"].numel, got["weight"].numel, got["grad_output"].numel) == (M * K, K * N,
                                                                                   M * N)
    assert (got["input"].scale is None) == block


def test_dense_rows_count_saturation_under_delayed_scaling():
    # The state's first cast seeds the scale from x itself; the second
    # call keeps that scale, so x * 4 saturates every element above
    # fp8_max / 4 of the seeded range.
    recipe = DelayedScaling()
    x, k, dy = _arrays()
    state = _state(recipe)

    def step(x, state):
        def f(x, state, rows):
            return fj.dense(x, k, state=state, recipe=recipe, statistics=rows)
        _, vjp = jax.vjp(f, x, state, fj.statistics_rows(1))
        _, state, rows = vjp(dy)
        return state, _by_role(rows)

    state, first = step(x, state)
    assert first["input"].saturated >= 1 and first["input"].scale == pytest.approx(
        448.0 / float(jnp.max(jnp.abs(x.astype(jnp.float32)))), rel=1e-6)
    _, second = step(x * 4, state)
    big = int(jnp.sum(jnp.abs(x.astype(jnp.float32)) * 4 > first["input"].amax))
    assert second["input"].scale == first["input"].scale
    assert second["input"].saturated >= big > 0


def _grads(fn, args, argnums):
    return jax.jit(jax.grad(fn, argnums=argnums))(*args)


@pytest.mark.parametrize("recipe", RECIPES, ids=["delayed", "current", "block"])
@pytest.mark.parametrize("layer", ["dense", "layernorm_dense", "layernorm_mlp"])
def test_rows_change_no_result(recipe, layer):
    x, k, _ = _arrays()
    gamma = jnp.ones((K,), jnp.bfloat16)
    k1 = jnp.concatenate([k, k * 0.5], axis=1)        # SwiGLU [gate | up], F = N
    k2 = jnp.asarray(np.random.default_rng(1).standard_normal((N, K)) * 0.05, jnp.bfloat16)
    linears = 2 if layer == "layernorm_mlp" else 1
    state = _state(recipe, linears)

    def loss(x, state, rows):
        if layer == "dense":
            y = fj.dense(x, k, state=state, recipe=recipe, statistics=rows)
        elif layer == "layernorm_dense":
            y = fj.layernorm_dense(x, gamma, None, k, normalization="rmsnorm", state=state,
                                   recipe=recipe, statistics=rows)
        else:
            y = fj.layernorm_mlp(x, gamma, None, k1, k2, normalization="rmsnorm",
                                 activation="swiglu", state=state, recipe=recipe,
                                 statistics=rows)
        return jnp.sum(y.astype(jnp.float32) ** 2)

    with_rows = _grads(loss, (x, state, fj.statistics_rows(linears)), (0, 1, 2))
    without = _grads(lambda x, state: loss(x, state, None), (x, state), (0, 1))
    for a, b in zip(jax.tree.leaves(without), jax.tree.leaves(with_rows[:2])):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    # Every cast is recorded, those fused into the norm and the activation too.
    names = sorted(s.name for s in fj.tensor_statistics(with_rows[2], "l"))
    if layer == "layernorm_mlp":
        assert names == [f"l.{gemm}/{role}" for gemm in ("fc1", "fc2")
                         for role in ("grad_output", "input", "weight")]
    else:
        assert names == ["l/grad_output", "l/input", "l/weight"]


def test_bad_rows_are_refused():
    x, k, _ = _arrays()
    with pytest.raises(ValueError, match=r"statistics_rows\(1\)"):
        fj.dense(x, k, recipe=CurrentScaling(), statistics=fj.statistics_rows(2))
    with pytest.raises(ValueError, match="statistics"):
        fj.dense(x, k, recipe=CurrentScaling(), statistics=jnp.zeros((3, 10), jnp.int32))
    with pytest.raises(ValueError, match="num_linears"):
        fj.statistics_rows(3)
    with pytest.raises(ValueError, match="statistics_rows"):
        fj.tensor_statistics(jnp.zeros((4, 10)), "l")


def test_rows_under_vmap_are_each_examples_rows():
    x = jnp.stack([_arrays(seed)[0][:32] for seed in range(3)])
    _, k, _ = _arrays()

    def loss(x, rows):
        return jnp.sum(fj.dense(x, k, recipe=CurrentScaling(), statistics=rows)
                       .astype(jnp.float32) ** 2)

    batched = jax.jit(jax.vmap(jax.grad(loss, argnums=1), in_axes=(0, None)))(
        x, fj.statistics_rows(1))
    for i in range(x.shape[0]):
        np.testing.assert_array_equal(batched[i],
                                      jax.grad(loss, argnums=1)(x[i], fj.statistics_rows(1)))


def test_rows_of_a_sharded_call_are_the_unsharded_calls():
    # Tokens split over two devices: each cast's statistics are those of the
    # whole tensor. XLA's host device count is fixed when jax starts: a
    # child process.
    script = """
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import NamedSharding, PartitionSpec as P
        import fp8kit.jax as fj
        from fp8kit.recipe import CurrentScaling, DelayedScaling
        rng = np.random.default_rng(0)
        x = jnp.asarray(rng.standard_normal((64, 128)), jnp.bfloat16)
        k = jnp.asarray(rng.standard_normal((128, 256)) * 0.05, jnp.bfloat16)
        xs = jax.device_put(x, NamedSharding(jax.make_mesh((2,), ("d",)), P("d", None)))
        for recipe in (CurrentScaling(), DelayedScaling()):
            state = (fj.DelayedScalingState.create(recipe)
                     if isinstance(recipe, DelayedScaling) else None)
            def rows(x):
                def loss(k, rows):
                    y = fj.dense(x, k, state=state, recipe=recipe, statistics=rows)
                    return jnp.sum(y.astype(jnp.float32) ** 2)
                return jax.jit(jax.grad(loss, argnums=1))(k, fj.statistics_rows(1))
            print(np.array_equal(rows(xs), rows(x)))
        """
    stdout = two_cpu_devices.run(script)
    assert stdout.split() == ["True", "True"]
