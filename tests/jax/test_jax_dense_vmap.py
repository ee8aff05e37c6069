"""fp8kit.jax.dense under jax.vmap: per example with current scaling or a
batched delayed state (in_axes=0), and as one call over the whole batch
with a shared delayed state (in_axes=None): every example cast with the
scale that call uses, the state recorded once with the batch's amax."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8kit.jax as fj
from fp8kit.recipe import AmaxReduction, CurrentScaling, DelayedScaling, Format


def _dense_grads(recipe):
    """(w, b, state, x, dy) -> (y, dx, dw, db, new state) of one call."""
    def run(w, b, s, x, dy):
        y, vjp = jax.vjp(lambda x, w, b, s: fj.dense(x, w, b, state=s, recipe=recipe), x, w, b, s)
        return (y, *vjp(dy))
    return run


def test_vmap_over_a_batch_axis_is_per_example():
    rng = np.random.default_rng(5)
    xs = jnp.asarray(rng.standard_normal((3, 16, 32)), jnp.bfloat16)
    xs = xs * jnp.asarray([1.0, 10.0, 0.1], jnp.bfloat16)[:, None, None]
    w = jnp.asarray(rng.standard_normal((32, 16)) * 0.2, jnp.float32)
    dys = jnp.asarray(rng.standard_normal((3, 16, 16)), jnp.bfloat16)
    recipe = CurrentScaling()

    def one(x, w, dy):
        y, vjp = jax.vjp(lambda x, w: fj.dense(x, w, recipe=recipe), x, w)
        return (y, *vjp(dy))

    batched = jax.jit(jax.vmap(one, in_axes=(0, None, 0)))(xs, w, dys)
    one = jax.jit(one)
    for i in range(3):
        single = one(xs[i], w, dys[i])
        for bt, s in zip(batched, single):
            np.testing.assert_array_equal(np.asarray(bt[i]), np.asarray(s))


def test_vmap_with_a_batched_delayed_state():
    rng = np.random.default_rng(6)
    recipe = DelayedScaling(amax_history_len=2)
    xs = jnp.asarray(rng.standard_normal((2, 16, 32)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((32, 16)) * 0.2, jnp.float32)
    states = jax.tree_util.tree_map(lambda a: jnp.stack([a, a * 2]),
                                    fj.DelayedScalingState.create(recipe))
    grad = jax.jit(jax.grad(lambda w, s, x: jnp.sum(fj.dense(x, w, state=s, recipe=recipe)
                                                    .astype(jnp.float32)), argnums=(0, 1)))
    dws, new_states = jax.jit(jax.vmap(grad, in_axes=(None, 0, 0)))(w, states, xs)
    for i in range(2):
        s_i = jax.tree_util.tree_map(lambda a: a[i], states)
        dw, ns = grad(w, s_i, xs[i])
        np.testing.assert_array_equal(np.asarray(dws[i]), np.asarray(dw))
        np.testing.assert_array_equal(np.asarray(new_states.scale[i]), np.asarray(ns.scale))


def _batch(rng, batch, tokens=16):
    # Examples of very different magnitudes: per-example scales would differ.
    mag = jnp.asarray(10.0 ** np.arange(batch) / 10, jnp.float32)
    xs = jnp.asarray(rng.standard_normal((batch, tokens, 32)), jnp.float32) * mag[:, None, None]
    dys = jnp.asarray(rng.standard_normal((batch, tokens, 16)), jnp.float32) / mag[:, None, None]
    w = jnp.asarray(rng.standard_normal((32, 16)) * 0.2, jnp.float32)
    b = jnp.asarray(rng.standard_normal(16) * 0.1, jnp.float32)
    return (xs.astype(jnp.bfloat16), w, b, dys.astype(jnp.bfloat16))


SHARED = [DelayedScaling(amax_history_len=3),
          DelayedScaling(fp8_format=Format.E4M3, margin=1,
                         amax_reduction=AmaxReduction.MOST_RECENT)]


@pytest.mark.parametrize("recipe", SHARED, ids=["hybrid", "e4m3-margin-recent"])
def test_shared_state_acts_as_one_call_over_the_batch(recipe):
    # Two steps from a fresh state (seeding, then recording) through the
    # vmapped layer and through one call on the merged batch: the same
    # states bit for bit, the same y and dx rows, dw and db summed.
    rng = np.random.default_rng(7)
    xs, w, b, dys = _batch(rng, 3)
    run = _dense_grads(recipe)
    vmapped = jax.jit(jax.vmap(run, in_axes=(None, None, None, 0, 0)))
    merged = jax.jit(run)
    s_v = s_m = fj.DelayedScalingState.create(recipe)
    for step in range(2):
        xs_t, dys_t = xs * (step + 1), dys * (step + 1)
        y, dx, dw, db, s_new = vmapped(w, b, s_v, xs_t, dys_t)
        y_m, dx_m, dw_m, db_m, s_m = merged(w, b, s_m, xs_t.reshape(48, 32),
                                            dys_t.reshape(48, 16))
        np.testing.assert_array_equal(np.asarray(y).reshape(48, 16), np.asarray(y_m))
        np.testing.assert_array_equal(np.asarray(dx).reshape(48, 32), np.asarray(dx_m))
        np.testing.assert_allclose(np.asarray(dw).sum(0), np.asarray(dw_m), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(db).sum(0), np.asarray(db_m), rtol=1e-5, atol=1e-5)
        for a, want in zip(jax.tree_util.tree_leaves(s_new), jax.tree_util.tree_leaves(s_m)):
            for example in np.asarray(a):  # the vmapped output repeats the one state
                np.testing.assert_array_equal(example, np.asarray(want))
        s_v = jax.tree_util.tree_map(lambda a: a[0], s_new)


def test_grad_of_vmap_with_a_shared_state_records_once():
    # The pattern that summed the per-example updates (the scale doubled):
    # the loss over a vmapped batch, differentiated in the state too.
    rng = np.random.default_rng(8)
    recipe = DelayedScaling(amax_history_len=2)
    xs, w, b, _ = _batch(rng, 4)

    def loss(w, s, xs):
        ys = jax.vmap(lambda x: fj.dense(x, w, b, state=s, recipe=recipe))(xs)
        return jnp.sum(ys.astype(jnp.float32) ** 2)

    def merged(w, s, xs):
        return loss(w, s, xs.reshape(1, 64, 32))

    state = fj.DelayedScalingState.create(recipe)
    got = jax.jit(jax.grad(loss, argnums=(0, 1)))(w, state, xs)
    want = jax.jit(jax.grad(merged, argnums=(0, 1)))(w, state, xs)
    for a, ref in zip(jax.tree_util.tree_leaves(got[1]), jax.tree_util.tree_leaves(want[1])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(ref))
    np.testing.assert_array_equal(np.asarray(got[1].seeded), np.ones(3, np.float32))
    np.testing.assert_allclose(np.asarray(got[0]), np.asarray(want[0]), rtol=1e-5, atol=1e-4)


def test_nested_vmap_with_a_shared_state():
    rng = np.random.default_rng(9)
    recipe = DelayedScaling(amax_history_len=2)
    xs, w, b, _ = _batch(rng, 4)
    xs = xs.reshape(2, 2, 16, 32)

    def loss(w, s, xs):
        f = lambda x: fj.dense(x, w, b, state=s, recipe=recipe)  # noqa: E731
        return jnp.sum(jax.vmap(jax.vmap(f))(xs).astype(jnp.float32))

    state = fj.DelayedScalingState.create(recipe)
    _, got = jax.jit(jax.grad(loss, argnums=(0, 1)))(w, state, xs)
    _, want = jax.jit(jax.grad(loss, argnums=(0, 1)))(w, state, xs.reshape(1, 1, 64, 32))
    for a, ref in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(ref))


def test_forward_only_vmap_with_a_fresh_shared_state():
    # Not differentiated: nothing recorded, every example cast with the
    # seed scale of the whole batch, the state returned as passed.
    rng = np.random.default_rng(10)
    recipe = DelayedScaling()
    xs, w, _, _ = _batch(rng, 3)
    state = fj.DelayedScalingState.create(recipe)
    f = jax.jit(lambda x, s: fj.dense(x, w, state=s, recipe=recipe))
    ys = jax.jit(jax.vmap(f, in_axes=(0, None)))(xs, state)
    np.testing.assert_array_equal(np.asarray(ys).reshape(48, 16),
                                  np.asarray(f(xs.reshape(48, 32), state)))


def test_empty_batch_with_a_shared_state():
    # No example: the state records what a call on no tokens records.
    recipe = DelayedScaling(amax_history_len=2)
    rng = np.random.default_rng(11)
    xs, w, b, _ = _batch(rng, 1)
    seeded = fj.DelayedScalingState(jnp.full((3, 2), 2.0, jnp.float32),
                                    jnp.asarray([3.0, 4.0, 5.0], jnp.float32),
                                    jnp.ones(3, jnp.float32))

    def loss(s, xs):
        ys = jax.vmap(lambda x: fj.dense(x, w, b, state=s, recipe=recipe))(xs)
        return jnp.sum(ys.astype(jnp.float32))

    got = jax.jit(jax.grad(loss))(seeded, xs[:0])
    want = jax.jit(jax.grad(loss))(seeded, xs[:1, :0])
    for a, ref in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(ref))
    # x and dy recorded an amax of 0, the kernel its own.
    np.testing.assert_array_equal(np.asarray(got.amax_history)[:, 0],
                                  [0.0, np.abs(np.asarray(w)).max(), 0.0])
