"""Delayed scaling against the NumPy reference of fp8kit/delayed_scaling.h
(tests/fp8_reference.py):
fp8kit.jax.delayed_scaling_update (roll the history, reduce it (max or
most recent), scale = fp8_max / amax / 2**margin unless that amax is zero
or not finite (then keep the previous scale); scale_inv = 1 / scale), and
the fused fp8kit_quantize_delayed_update custom call the dense layer runs
(seeding, recording or not, a given starting amax, column sums)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8_reference as ref
import fp8kit.jax as fj
from fp8kit.jax import _ffi
from fp8kit.recipe import AmaxReduction

F32 = np.float32
FP8_MAX = {k: F32(v) for k, v in ref.FP8_MAX.items()}


@pytest.mark.parametrize("amax_reduction", [AmaxReduction.MAX, AmaxReduction.MOST_RECENT])
@pytest.mark.parametrize("margin", [0, 2])
def test_matches_the_rule_over_several_steps(amax_reduction, margin):
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
        want = ref.delayed_update(history, amax, scale, fmts, margin, amax_reduction)
        got = update(history, amax, scale, tuple(fmts), margin, amax_reduction)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(np.asarray(g), w)
        history, scale = np.asarray(got[0]), np.asarray(got[1])


def test_zero_and_nonfinite_keep_the_previous_scale():
    history = np.zeros((3, 2), np.float32)
    scale = np.array([2.0, 3.0, 5.0], np.float32)
    amax = np.array([0.0, np.inf, np.nan], np.float32)
    h, s, si = fj.delayed_scaling_update(history, amax, scale, ["e4m3"] * 3,
                                         amax_reduction=AmaxReduction.MOST_RECENT)
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


# --- the fused quantize-seed-record call (fp8kit_quantize_delayed_update) ---------------

def _fused(xs, history, scale, seeded, record, margin=0, sums=None, amax=None,
           amax_reduction="max", fmts=None, first_slot=0):
    n = len(xs)
    call = _ffi.DelayedQuantize(
        fmts=tuple(fmts or ["e4m3"] * n), copies=((True, True),) * n,
        sums_dtypes=tuple(sums or [None] * n), record=record, margin=margin,
        amax_reduction=amax_reduction, first_slot=first_slot)
    h, s, sd, outs = _ffi.quantize_delayed_update_call(
        call, jnp.asarray(history, jnp.float32), jnp.asarray(scale, jnp.float32),
        jnp.asarray(seeded, jnp.float32), [jnp.asarray(x) for x in xs],
        None if amax is None else jnp.asarray(amax, jnp.float32))
    # (state, every input's scale_inv, (data, columnwise_data, sums) per input)
    return h, s, sd, np.float32([o[3] for o in outs]), [o[:3] for o in outs]


@pytest.mark.parametrize("record", [True, False])
def test_fused_call_seeds_a_fresh_slot_and_records_only_when_asked(record):
    rng = np.random.default_rng(20)
    x = rng.standard_normal((40, 32)).astype(np.float32) * 3
    w = rng.standard_normal((32, 16)).astype(np.float32)
    history = np.array([[0.0, 0.0], [7.0, 5.0]], np.float32)
    scale = np.array([1.0, 2.0], np.float32)
    seeded = np.array([0, 1], np.float32)     # x fresh, w seeded
    h, s, sd, scale_inv, outs = _fused([x, w], history, scale, seeded, record, margin=1)
    seed = ref.delayed_scale(np.abs(x).max(), F32(1), "e4m3", 1)
    used = [seed, F32(2.0)]
    for (data, columnwise_data, _), t, u in zip(outs, (x, w), used):
        want = ref.quantize_bits(t, u, "e4m3")
        np.testing.assert_array_equal(np.asarray(data).view(np.uint8), want)
        np.testing.assert_array_equal(np.asarray(columnwise_data).view(np.uint8), want.T)
    np.testing.assert_array_equal(np.asarray(scale_inv), F32(1) / np.float32(used))
    if not record:
        for got, want in ((h, history), (s, scale), (sd, seeded)):
            np.testing.assert_array_equal(np.asarray(got), want)
        return
    amaxes = np.float32([np.abs(x).max(), np.abs(w).max()])
    want_h, want_s, _ = ref.delayed_update(history, amaxes, used, ["e4m3"] * 2, 1,
                                           AmaxReduction.MAX)
    np.testing.assert_array_equal(np.asarray(h), want_h)
    np.testing.assert_array_equal(np.asarray(s), want_s)
    np.testing.assert_array_equal(np.asarray(sd), [1, 1])


def test_fused_call_updates_only_the_rows_of_its_slots():
    # The whole state goes in; input 0 uses row first_slot, the other rows
    # come back bit for bit as they went in.
    x = np.random.default_rng(22).standard_normal((24, 16)).astype(np.float32) * 5
    history = np.array([[3.0, 1.0], [7.0, 5.0], [2.0, 4.0]], np.float32)
    scale = np.array([1.5, 2.0, 0.25], np.float32)
    seeded = np.array([1, 1, 1], np.float32)
    h, s, sd, scale_inv, [(data, _, _)] = _fused([x], history, scale, seeded, True,
                                                 fmts=["e5m2"], first_slot=2)
    h1, s1, sd1, scale_inv1, [(data1, _, _)] = _fused([x], history[2:], scale[2:], seeded[2:],
                                                      True, fmts=["e5m2"])
    np.testing.assert_array_equal(np.asarray(h)[:2], history[:2])
    np.testing.assert_array_equal(np.asarray(s)[:2], scale[:2])
    np.testing.assert_array_equal(np.asarray(h)[2:], np.asarray(h1))
    np.testing.assert_array_equal(np.asarray(s)[2:], np.asarray(s1))
    np.testing.assert_array_equal(np.asarray(sd), [1, 1, 1])
    np.testing.assert_array_equal(np.asarray(scale_inv), np.asarray(scale_inv1))
    np.testing.assert_array_equal(np.asarray(data).view(np.uint8),
                                  ref.quantize_bits(x, 0.25, "e5m2"))
    assert not np.array_equal(np.asarray(h)[2], history[2])  # it did record


def test_fused_call_starts_from_a_given_amax():
    # A shard of a tensor: the global amax (here 100) seeds and is recorded.
    x = np.random.default_rng(21).standard_normal((16, 16)).astype(np.float32)
    h, s, _, scale_inv, [(data, _, _)] = _fused([x], [[0.0]], [1.0], [0], True, amax=[100.0])
    np.testing.assert_array_equal(np.asarray(h), [[100.0]])
    np.testing.assert_array_equal(np.asarray(s), [FP8_MAX["e4m3"] / F32(100)])
    np.testing.assert_array_equal(np.asarray(data).view(np.uint8),
                                  ref.quantize_bits(x, FP8_MAX["e4m3"] / F32(100), "e4m3"))


@pytest.mark.parametrize("rows", [2, 35, 300])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_fused_call_column_sums_follow_the_documented_order(rows, dtype):
    x = jnp.asarray(np.random.default_rng(rows).standard_normal((rows, 48)) * 100, dtype)
    *_, [(_, _, sums)] = _fused([x], [[0.0]], [1.0], [1], True, sums=[jnp.dtype(dtype)],
                                fmts=["e5m2"])
    want = ref.column_sums(np.asarray(x, np.float32)).astype(jnp.dtype(dtype))
    assert sums.dtype == jnp.dtype(dtype)
    np.testing.assert_array_equal(np.asarray(sums), want)


def test_current_scaling_call_column_sums():
    x = jnp.asarray(np.random.default_rng(22).standard_normal((130, 32)), jnp.bfloat16)
    *_, sums = _ffi.quantize_current_scaling_call(x, "e4m3", True, True, 0.0, False,
                                                  jnp.dtype(jnp.float32))
    np.testing.assert_array_equal(np.asarray(sums), ref.column_sums(np.asarray(x, np.float32)))
