"""Properties of fp8kit.jax.dense and DelayedScalingState: one
differentiated step on drawn shapes (0 tokens included), dtypes, recipes
and values gives the output, the three gradients and the new
delayed-scaling state of the layer protocol's reference
(layer_reference.py); vmap with an unbatched state is either refused or
reduced like the recipe; bad inputs (a state holding a value no update
writes among them) get a clear error in Python. Run in a child process by
test_jax_properties.py."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st

import fp8_reference as ref
import fp8kit.jax as fj
import layer_reference as lref
from fp8_strategies import SPECIAL, arrays, moderate_f32, prop, recipes
from fp8kit.recipe import CurrentScaling, DelayedScaling
from jax_support import HP, device_or_skip, expect_clear_error

SLOTS = ("x", "w", "dy")  # the rows of DelayedScalingState


@st.composite
def dense_problems(draw):
    k = 16 * draw(st.integers(1, 3))
    n = 16 * draw(st.integers(1, 3))
    lead = draw(st.sampled_from([(0,), (1,), (3,), (17,), (2, 5), (0, 4)]))
    m = int(np.prod(lead))
    gain = np.float32(2.0 ** draw(st.integers(-6, 6)))
    x = draw(arrays((m, k), moderate_f32)) * gain
    if m and draw(st.integers(0, 4)) == 0:
        x.reshape(-1)[draw(st.integers(0, m * k - 1))] = draw(st.sampled_from(SPECIAL))
    kernel = draw(arrays((k, n), moderate_f32)) / gain
    bias = draw(st.one_of(st.none(), arrays((n,), moderate_f32)))
    dy = draw(arrays((m, n), moderate_f32)) * np.float32(2.0 ** draw(st.integers(-12, 0)))
    return dict(k=k, n=n, lead=lead, x=x, kernel=kernel, bias=bias, dy=dy)


def _close(got, want_bound, out: str, what: str):
    want, bound = want_bound
    ref.assert_result_close(np.asarray(got).astype(np.float32), want, bound, out, what)


@prop(max_examples=25, p=dense_problems(), r=recipes(),
      dtype=st.sampled_from(["float32", "bfloat16"]), jit=st.booleans())
def check_dense_step(device, p, r, dtype, jit):
    dev = device_or_skip(device)
    model, recipe = r
    k, n, lead = p["k"], p["n"], p["lead"]
    put = (lambda a: jax.device_put(jnp.asarray(a).astype(HP[dtype]), dev))
    x, kernel = put(p["x"]).reshape(*lead, k), put(p["kernel"])
    bias = None if p["bias"] is None else put(p["bias"])
    dy = put(p["dy"]).reshape(*lead, n)
    state = fj.DelayedScalingState.create(recipe) if model.delayed else None

    def step(x, kernel, bias, state):
        y, vjp = jax.vjp(lambda x_, k_, b_, s_: fj.dense(x_, k_, b_, state=s_, recipe=recipe),
                         x, kernel, bias, state)
        return y, vjp(dy)

    y, (dx, dk, db, new_state) = (jax.jit(step) if jit else step)(x, kernel, bias, state)
    ref_state = lref.fresh_state(model)
    f32 = (lambda a: np.asarray(a).astype(np.float32))
    xv, kv = f32(x).reshape(-1, k), f32(kernel)
    bv = None if bias is None else f32(bias)
    want_y, bound, saved = lref.forward(model, ref_state, xv, kv.T, bv, dtype, True, device)
    assert y.shape == (*lead, n) and y.dtype == HP[dtype]
    _close(y, (want_y, bound), dtype, "y")
    want_dx, want_dw, want_db = lref.backward(model, ref_state, saved, f32(dy).reshape(-1, n),
                                              dtype, dtype, device)
    _close(dx, want_dx, dtype, "dx")
    _close(np.asarray(dk).T, want_dw, dtype, "dkernel")
    if bias is not None:
        _close(db, want_db, dtype, "dbias")
    if model.delayed:
        for i, slot in enumerate(SLOTS):
            ref.assert_floats_equal(np.asarray(new_state.amax_history)[i],
                                    ref_state[slot].history, f"state amax_history[{slot}]")
            ref.assert_floats_equal(np.asarray(new_state.scale)[i], ref_state[slot].scale,
                                    f"state scale[{slot}]")
            assert float(np.asarray(new_state.seeded)[i]) == 1.0, f"slot {slot} not seeded"


def check_dense_vmap_unbatched_state(device):
    """vmap over examples with one shared state (grad outside the vmap):
    refused with a clear error, or the state is updated once from the
    whole batch (the max of the examples' amaxes), never with the sum of
    per-example updates. Fixed data: the property is about the transform,
    and each example costs a compilation."""
    dev = device_or_skip(device)
    recipe = DelayedScaling(amax_history_len=2)
    rng = np.random.default_rng(5)
    x = jax.device_put(jnp.asarray(rng.standard_normal((3, 4, 32)).astype(np.float32)
                                   * np.float32([[[1.0]], [[3.0]], [[0.5]]])), dev)
    kernel = jax.device_put(jnp.asarray(rng.standard_normal((32, 16)).astype(np.float32)), dev)
    state = fj.DelayedScalingState.create(recipe)

    def loss(k_, s_):
        per_example = jax.vmap(lambda xi: fj.dense(xi, k_, state=s_, recipe=recipe))
        return jnp.sum(per_example(x))

    try:
        _, new_state = jax.grad(loss, argnums=(0, 1))(kernel, state)
    except (TypeError, ValueError, NotImplementedError) as e:
        assert "fp8kit.jax.dense" in str(e), f"the error does not name fp8kit.jax.dense: {e}"
        return
    new_state = jax.tree_util.tree_map(np.asarray, new_state)
    batch_amax = ref.amax(np.asarray(x))
    seed = ref.delayed_scale(batch_amax, 1.0, "e4m3", 0)
    ref.assert_floats_equal(new_state.amax_history[0, 0], batch_amax,
                            "x amax recorded from the whole batch")
    ref.assert_floats_equal(new_state.scale[0], ref.delayed_scale(batch_amax, seed, "e4m3", 0),
                            "x scale from the whole batch")


@prop(max_examples=40, case=st.sampled_from(
    ["no_state", "state_for_current", "state_shape", "state_dtype", "recipe_type", "x_rank1",
     "k_mismatch", "k_not_multiple", "n_not_multiple", "x_f64", "bias_shape", "bias_int",
     "kernel_rank3", "scale_nan", "scale_zero", "scale_negative", "history_negative",
     "seeded_2"]))
def check_dense_rejects(device, case):
    device_or_skip(device)
    delayed, current = DelayedScaling(), CurrentScaling()
    good = fj.DelayedScalingState.create(delayed)
    args = dict(x=jnp.ones((4, 32)), kernel=jnp.ones((32, 16)), bias=None, state=good,
                recipe=delayed)
    args.update({
        "no_state": dict(state=None),
        "state_for_current": dict(recipe=current),
        "state_shape": dict(state=fj.DelayedScalingState.create(
            DelayedScaling(amax_history_len=3))),
        "state_dtype": dict(state=fj.DelayedScalingState(
            amax_history=good.amax_history.astype(jnp.bfloat16), scale=good.scale,
            seeded=good.seeded)),
        "recipe_type": dict(recipe="delayed"),
        "x_rank1": dict(x=jnp.ones(32)),
        "k_mismatch": dict(x=jnp.ones((4, 48))),
        "k_not_multiple": dict(x=jnp.ones((4, 24)), kernel=jnp.ones((24, 16))),
        "n_not_multiple": dict(kernel=jnp.ones((32, 12))),
        "x_f64": dict(x=np.ones((4, 32), np.float64)),
        "bias_shape": dict(bias=jnp.ones(8)),
        "bias_int": dict(bias=jnp.ones(16, jnp.int32)),
        "kernel_rank3": dict(kernel=jnp.ones((1, 32, 16))),
        # Values no update writes, in a concrete state.
        "scale_nan": dict(state=dataclasses.replace(good, scale=good.scale.at[1].set(jnp.nan))),
        "scale_zero": dict(state=dataclasses.replace(good, scale=good.scale.at[0].set(0.0))),
        "scale_negative": dict(state=dataclasses.replace(good, scale=-good.scale)),
        "history_negative": dict(state=dataclasses.replace(
            good, amax_history=good.amax_history.at[2, 0].set(-1.0))),
        "seeded_2": dict(state=dataclasses.replace(good, seeded=good.seeded + 2.0)),
    }[case])
    expect_clear_error("fp8kit.jax.dense", fj.dense, args.pop("x"), args.pop("kernel"),
                       args.pop("bias"), **args)
