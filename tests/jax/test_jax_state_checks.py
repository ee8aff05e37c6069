"""A DelayedScalingState's values and uses: each layer refuses a concrete
state holding a value no update writes (a NaN, zero or negative scale, a
negative amax, a seeded flag other than 0 or 1), naming the field and the
index, where it would otherwise compute NaN; DelayedScalingState.from_arrays
checks the same; two calls on one state in one differentiated function
are refused while tracing (their cotangents, the updated states, would
add up), and the uses that sum nothing stay allowed."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8kit.jax as fj
from fp8kit.recipe import DelayedScaling

RECIPE = DelayedScaling(amax_history_len=4)
HIDDEN, FFN = 32, 16
RNG = np.random.default_rng(0)
X = jnp.asarray(RNG.standard_normal((16, HIDDEN)), jnp.bfloat16)
GAMMA, BETA = jnp.ones(HIDDEN, jnp.bfloat16), jnp.zeros(HIDDEN, jnp.bfloat16)
K1 = jnp.asarray(RNG.standard_normal((HIDDEN, FFN)) / 4, jnp.float32)
K2 = jnp.asarray(RNG.standard_normal((FFN, HIDDEN)) / 4, jnp.float32)

# Each layer on (x, state): its name and its number of Linears.
LAYERS = {
    "dense": (1, lambda x, s: fj.dense(x, K1, state=s, recipe=RECIPE)),
    "layernorm_dense": (1, lambda x, s: fj.layernorm_dense(x, GAMMA, BETA, K1, state=s,
                                                           recipe=RECIPE)),
    "layernorm_mlp": (2, lambda x, s: fj.layernorm_mlp(x, GAMMA, BETA, K1, K2, state=s,
                                                       recipe=RECIPE)),
}


def _with(state, field, index, value):
    arrays = {f: np.array(getattr(state, f)) for f in ("amax_history", "scale", "seeded")}
    arrays[field].reshape(-1)[index] = value
    return fj.DelayedScalingState(**{f: jnp.asarray(a) for f, a in arrays.items()})


BAD = [("scale", 1, np.nan, r"scale holds nan \(flat index 1\); scale values must be finite "
                           "and > 0"),
       ("scale", 0, 0.0, r"scale holds 0 \(flat index 0\); scale values must be finite and > 0"),
       ("scale", 2, -1.0, r"scale holds -1 \(flat index 2\); scale values must be finite and > 0"),
       ("scale", 0, np.inf, "scale holds inf"),
       ("amax_history", 5, -2.0, r"amax_history holds -2 \(flat index 5\); amax_history values "
                                 r"must be >= 0 \(NaN and inf allowed\)"),
       ("seeded", 1, 0.5, r"seeded holds 0.5 \(flat index 1\); seeded values must be 0.0 "
                          r"\(fresh\) or 1.0 \(seeded\)")]


@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("field,index,value,match", BAD,
                         ids=[f"{f}={v}" for f, _, v, _ in BAD])
def test_each_layer_refuses_a_concrete_state_with_a_bad_value(layer, field, index, value, match):
    num_linears, call = LAYERS[layer]
    state = _with(fj.DelayedScalingState.create(RECIPE, num_linears), field, index, value)
    with pytest.raises(ValueError, match=rf"fp8kit.jax.{layer}: state.{match}.*start from a fresh"):
        call(X, state)


def test_a_seeded_of_2_is_named_as_two_uses_of_the_state():
    state = fj.DelayedScalingState.create(RECIPE)
    state = fj.DelayedScalingState(state.amax_history, 2 * state.scale, 2 * jnp.ones(3))
    with pytest.raises(ValueError, match="seeded holds 2 .* what 2 uses of one state in a "
                                         "differentiated step leave.*call it once per step"):
        fj.dense(X, K1, state=state, recipe=RECIPE)


def test_an_amax_history_with_nan_and_inf_is_valid():
    # A recorded amax of a tensor holding NaN or inf: the update skips it.
    state = _with(_with(fj.DelayedScalingState.create(RECIPE), "amax_history", 0, np.nan),
                  "amax_history", 1, np.inf)
    assert fj.dense(X, K1, state=state, recipe=RECIPE).shape == (16, FFN)


def test_from_arrays_checks_dtypes_shapes_and_values():
    fresh = fj.DelayedScalingState.create(RECIPE, num_linears=2)
    h, s, sd = fresh.amax_history, fresh.scale, fresh.seeded
    made = fj.DelayedScalingState.from_arrays(h, s, sd)
    assert made.amax_history is h and made.scale is s and made.seeded is sd
    with pytest.raises(TypeError, match="from_arrays: seeded has dtype int32"):
        fj.DelayedScalingState.from_arrays(h, s, sd.astype(jnp.int32))
    with pytest.raises(TypeError, match="from_arrays: scale is a list"):
        fj.DelayedScalingState.from_arrays(h, [1.0] * 6, sd)
    with pytest.raises(ValueError, match=r"from_arrays: .* shapes \(\(6, 4\), \(4,\), \(6,\)\)"):
        fj.DelayedScalingState.from_arrays(h, s[:4], sd)
    with pytest.raises(ValueError, match=r"from_arrays: scale holds nan \(flat index 3\)"):
        fj.DelayedScalingState.from_arrays(h, s.at[3].set(jnp.nan), sd)
    # Traced, only the shapes and dtypes can be checked.
    jax.jit(lambda s: fj.DelayedScalingState.from_arrays(h, s, sd).scale)(s)


@pytest.mark.parametrize("num_linears,exc", [(True, TypeError), (1.0, TypeError),
                                             (0, ValueError), (3, ValueError)])
def test_create_takes_the_int_1_or_2(num_linears, exc):
    with pytest.raises(exc, match=rf"create: num_linears .* must be an int >= 1 and <= 2, got "
                                  rf"{num_linears!r}"):
        fj.DelayedScalingState.create(RECIPE, num_linears=num_linears)


def _loss(call):
    return lambda x, s: jnp.sum(call(x, s).astype(jnp.float32))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("layer", LAYERS)
def test_two_calls_on_one_state_in_a_differentiated_function_are_refused(layer, jit):
    num_linears, call = LAYERS[layer]
    state = fj.DelayedScalingState.create(RECIPE, num_linears)
    twice = lambda x, s: _loss(call)(x, s) + _loss(call)(2 * x, s)  # noqa: E731
    grad = jax.grad(twice, argnums=(0, 1))
    with pytest.raises(ValueError, match=rf"fp8kit.jax.{layer}: this DelayedScalingState is "
                                         "already used by another call .* seeded 2.0"):
        (jax.jit(grad) if jit else grad)(X, state)


def test_uses_that_sum_no_updates_are_allowed():
    state = fj.DelayedScalingState.create(RECIPE)
    call = LAYERS["dense"][1]
    twice = lambda x, s: _loss(call)(x, s) + _loss(call)(2 * x, s)  # noqa: E731
    # Not differentiated: the state is read, never updated.
    jax.jit(twice)(X, state)
    # Differentiated for x only: the state's cotangent is dropped.
    jax.jit(jax.grad(twice))(X, state)

    # One differentiation per microbatch, each from the same state.
    @jax.jit
    def microbatches(x, s):
        return [jax.grad(_loss(call), argnums=1)(x[i:i + 8], s) for i in (0, 8)]

    first, second = microbatches(X, state)
    np.testing.assert_array_equal(first.seeded, 1.0)
    np.testing.assert_array_equal(second.seeded, 1.0)

    # One call per branch: only one branch runs.
    def branches(x, s):
        return jax.lax.cond(x[0, 0] > 0, lambda: _loss(call)(x, s), lambda: _loss(call)(-x, s))

    _, new = jax.jit(jax.grad(branches, argnums=(0, 1)))(X, state)
    np.testing.assert_array_equal(new.seeded, 1.0)
    # A state used in one step is used again in the next.
    step = jax.jit(jax.grad(_loss(call), argnums=1))
    np.testing.assert_array_equal(step(X, step(X, state)).seeded, 1.0)
