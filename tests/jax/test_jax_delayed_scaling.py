"""fp8kit.jax.delayed_scaling_update against a NumPy model of the rule in
fp8kit/delayed_scaling.h: roll the history, reduce it (max or most recent),
scale = fp8_max / amax / 2**margin unless that amax is zero or not finite
(then keep the previous scale); scale_inv = 1 / scale."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8kit.jax as fj
from fp8kit.recipe import AmaxReduction

F32 = np.float32
FP8_MAX = {"e4m3": F32(448.0), "e5m2": F32(57344.0)}


def _ref_update(history, amax, scale, fmts, margin, reduction):
    history = np.array(history, np.float32)
    scale = np.array(scale, np.float32)
    history[:, 1:] = history[:, :-1].copy()
    history[:, 0] = amax
    for i, fmt in enumerate(fmts):
        row = history[i]
        red = (F32(np.nan) if np.isnan(row).any() else row.max()) \
            if reduction is AmaxReduction.MAX else row[0]
        if np.isfinite(red) and red > 0:
            s = FP8_MAX[fmt] / red * F32(2.0 ** -margin)
            s = F32(min(max(s, np.finfo(np.float32).tiny), np.finfo(np.float32).max))
            scale[i] = s
    return history, scale, F32(1) / scale


@pytest.mark.parametrize("reduction", [AmaxReduction.MAX, AmaxReduction.MOST_RECENT])
@pytest.mark.parametrize("margin", [0, 2])
def test_matches_the_rule_over_several_steps(reduction, margin):
    rng = np.random.default_rng(margin)
    fmts = ["e4m3", "e4m3", "e5m2", "e4m3", "e5m2"]
    n, length = len(fmts), 4
    history = np.zeros((n, length), np.float32)
    scale = np.ones(n, np.float32)
    update = jax.jit(fj.delayed_scaling_update, static_argnums=(3, 4, 5))
    for step in range(7):
        amax = (rng.uniform(0.1, 100, n) * 10.0 ** rng.integers(-3, 3, n)).astype(np.float32)
        if step == 3:
            amax[1], amax[2], amax[4] = 0.0, np.inf, np.nan    # kept scales
        want = _ref_update(history, amax, scale, fmts, margin, reduction)
        got = update(history, amax, scale, tuple(fmts), margin, reduction)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(np.asarray(g), w)
        history, scale = np.asarray(got[0]), np.asarray(got[1])


def test_zero_and_nonfinite_keep_the_previous_scale():
    history = np.zeros((3, 2), np.float32)
    scale = np.array([2.0, 3.0, 5.0], np.float32)
    amax = np.array([0.0, np.inf, np.nan], np.float32)
    h, s, si = fj.delayed_scaling_update(history, amax, scale, ["e4m3"] * 3,
                                         reduction=AmaxReduction.MOST_RECENT)
    np.testing.assert_array_equal(np.asarray(s), scale)
    np.testing.assert_array_equal(np.asarray(si), F32(1) / scale)


def test_inputs_are_not_modified_in_place():
    # The handler aliases history and scale to its outputs; JAX must keep the
    # caller's arrays intact (it copies when an input is still live).
    history = jnp.ones((2, 3), jnp.float32)
    scale = jnp.ones((2,), jnp.float32)
    h, s, _ = jax.jit(lambda h, a, s: fj.delayed_scaling_update(h, a, s, ["e4m3", "e5m2"]))(
        history, jnp.array([4.0, 8.0], jnp.float32), scale)
    np.testing.assert_array_equal(np.asarray(history), np.ones((2, 3)))
    np.testing.assert_array_equal(np.asarray(scale), np.ones(2))
    np.testing.assert_array_equal(np.asarray(h)[:, 0], [4.0, 8.0])
    np.testing.assert_array_equal(np.asarray(s), [FP8_MAX["e4m3"] / 4, FP8_MAX["e5m2"] / 8])


def test_argument_errors():
    h, a, s = np.zeros((2, 4), np.float32), np.zeros(2, np.float32), np.ones(2, np.float32)
    with pytest.raises(ValueError, match="lists 1 formats for 2 tensors"):
        fj.delayed_scaling_update(h, a, s, ["e4m3"])
    with pytest.raises(TypeError, match="not an FP8 format"):
        fj.delayed_scaling_update(h, a, s, ["e4m3", "int8"])
    with pytest.raises(ValueError, match=r"must have shape \(2,\)"):
        fj.delayed_scaling_update(h, np.zeros(3, np.float32), s, ["e4m3"] * 2)
    with pytest.raises(TypeError, match="amax_history has dtype float16"):
        fj.delayed_scaling_update(h.astype(np.float16), a, s, ["e4m3"] * 2)
    with pytest.raises(ValueError, match="margin must be an int >= 0"):
        fj.delayed_scaling_update(h, a, s, ["e4m3"] * 2, margin=-1)
    with pytest.raises(ValueError, match="amax_history must be"):
        fj.delayed_scaling_update(np.zeros(4, np.float32), a, s, ["e4m3"] * 2)
