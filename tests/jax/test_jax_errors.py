"""Bad arguments to fp8kit.jax's public functions fail in Python, before
anything is lowered, with the function and the argument named (never an
FFI decode error or a reshape error from inside JAX); and quantize with a
bad scale value follows the core's policy (NaN outputs, never a plausible
result)."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import fp8kit.jax as fj
from fp8kit.jax import _ffi
from fp8kit.recipe import CurrentScaling, DelayedScaling

F32 = np.float32
X = jnp.asarray(np.linspace(-3, 3, 16 * 32).reshape(16, 32), jnp.bfloat16)
W = jnp.asarray(np.linspace(-1, 1, 32 * 16).reshape(32, 16), jnp.float32)


def _raises(exc, match, f):
    """f() raises exc matching `match`, and so does tracing it under jit
    (the check runs in Python, before lowering)."""
    with pytest.raises(exc, match=match):
        f()
    with pytest.raises(exc, match=match):
        jax.jit(lambda: f()).lower()


# --- quantize: the scale policy -------------------------------------------------------

@pytest.mark.parametrize("scale", [0.0, -0.0, -1.0, np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_quantize_with_a_bad_scale_gives_nan(scale, fmt):
    x = X.at[3, 4].set(-7.5)
    st = fj.quantize(x, F32(scale), fmt, rowwise=True, columnwise=True)
    nan_code = 0x7F  # the FP8 NaN both formats use
    np.testing.assert_array_equal(np.asarray(st.data).view(np.uint8), nan_code)
    np.testing.assert_array_equal(np.asarray(st.columnwise_data).view(np.uint8), nan_code)
    assert np.isnan(float(st.scale_inv))
    assert float(st.amax) == 7.5  # still the input's
    assert np.isnan(np.asarray(fj.dequantize(st))).all()


def test_quantize_with_a_denormal_scale_is_used_as_is():
    tiny = np.float32(2.0**-127)  # positive, denormal in float32
    x = np.full((4, 16), 2.0**120, F32)
    st = fj.quantize(jnp.asarray(x), tiny, "e4m3")
    want = (x * tiny).astype(ml_dtypes.float8_e4m3fn)  # 2**-7, exact in E4M3
    np.testing.assert_array_equal(np.asarray(st.data).view(np.uint8), want.view(np.uint8))
    assert float(st.scale_inv) == 2.0**127


# --- scale and scale_inv of the wrong dtype or shape ----------------------------------

def _st(scale_inv=F32(0.5)):
    q = fj.quantize(X, F32(2.0), "e4m3", True, True)
    return fj.ScaledTensor(q.data, scale_inv, q.columnwise_data)


def test_scale_arguments():
    _raises(TypeError, "quantize: scale has dtype float16", lambda: fj.quantize(X, jnp.float16(1)))
    _raises(ValueError, r"quantize: scale has shape \(1, 1\)",
            lambda: fj.quantize(X, jnp.ones((1, 1), jnp.float32)))
    _raises(TypeError, "quantize: scale is None", lambda: fj.quantize(X, None))
    _raises(TypeError, "compute_scale: amax has dtype int32",
            lambda: fj.compute_scale(jnp.int32(3)))


def test_scaled_tensor_fields():
    q = fj.quantize(X, F32(2.0), "e4m3", True, True)
    with pytest.raises(TypeError, match="ScaledTensor: scale_inv has dtype float16"):
        fj.ScaledTensor(q.data, jnp.float16(1.0))
    with pytest.raises(TypeError, match="ScaledTensor: data has dtype float32"):
        fj.ScaledTensor(jnp.ones((4, 4)), F32(1.0), fp8_dtype="e4m3")
    with pytest.raises(TypeError, match="ScaledTensor: columnwise_data has dtype bfloat16"):
        fj.ScaledTensor(q.data, F32(1.0), X.T)


@pytest.mark.parametrize("bad, exc, match", [
    (jnp.ones((2,), jnp.float32), ValueError, r"st.scale_inv has shape \(2,\)"),
    ([0.5], TypeError, "st.scale_inv has dtype float64"),
    (None, TypeError, "st.scale_inv is None"),
])
def test_dequantize_scale_inv(bad, exc, match):
    st = _st(bad)
    _raises(exc, "fp8kit.jax.dequantize: " + match, lambda: fj.dequantize(st))


@pytest.mark.parametrize("bad, exc, match", [
    (jnp.ones((2,), jnp.float32), ValueError, r"a.scale_inv has shape \(2,\)"),
    (jnp.ones((1, 1), jnp.float32), ValueError, r"a.scale_inv has shape \(1, 1\)"),
])
def test_gemm_scale_inv(bad, exc, match):
    a = _st(bad)
    b = fj.quantize(W, F32(1.0), "e4m3", True, True)
    _raises(exc, "fp8kit.jax.gemm: " + match, lambda: fj.gemm(a, b))


def test_scale_inv_of_one_element_and_a_python_float_still_work():
    ref = np.asarray(fj.dequantize(_st(F32(0.5))))
    np.testing.assert_array_equal(np.asarray(fj.dequantize(_st(jnp.full((1,), 0.5)))), ref)
    np.testing.assert_array_equal(np.asarray(fj.dequantize(_st(0.5))), ref)


def test_mismatched_copies():
    q = _st()
    bad = fj.ScaledTensor(q.data, q.scale_inv, q.columnwise_data[:, :8])
    _raises(ValueError, r"dequantize: st.columnwise_data has shape \(32, 8\) but data",
            lambda: fj.dequantize(bad))


# --- gemm arguments -------------------------------------------------------------------

def test_gemm_arguments():
    a = _st()
    b = fj.quantize(W, F32(1.0), "e4m3", True, True)
    _raises(TypeError, "gemm: out_dtype=None is not supported",
            lambda: fj.gemm(a, b, out_dtype=None))
    _raises(TypeError, "gemm: out_dtype='bf16' is not supported; use one of jnp.bfloat16",
            lambda: fj.gemm(a, b, out_dtype="bf16"))
    _raises(TypeError, "gemm: bias must be a jax or NumPy array, got list",
            lambda: fj.gemm(a, b, bias=[0.0] * 16))
    _raises(TypeError, "gemm: trans_a=None must be True or False",
            lambda: fj.gemm(a, b, trans_a=None))
    _raises(TypeError, "gemm: use_split_accumulator=1 must be True or False",
            lambda: fj.gemm(a, b, use_split_accumulator=1))
    # Spelled in full, a dtype name is still a dtype.
    assert fj.gemm(a, b, out_dtype="bfloat16").dtype == jnp.bfloat16


# --- quantize_current_scaling / compute_scale / quantize flags ------------------------

@pytest.mark.parametrize("eps, exc", [("0.1", TypeError), (True, TypeError), (None, TypeError),
                                      (float("nan"), ValueError), (float("inf"), ValueError),
                                      (1e39, ValueError), (-1e-30, ValueError)])
def test_amax_epsilon(eps, exc):
    _raises(exc, "quantize_current_scaling: amax_epsilon must be",
            lambda: fj.quantize_current_scaling(X, amax_epsilon=eps))
    _raises(exc, "compute_scale: amax_epsilon must be",
            lambda: fj.compute_scale(F32(1.0), amax_epsilon=eps))


def test_flags():
    _raises(TypeError, "power_2_scale='no' must be True or False",
            lambda: fj.quantize_current_scaling(X, power_2_scale="no"))
    _raises(TypeError, "quantize: columnwise=1 must be True or False",
            lambda: fj.quantize(X, F32(1.0), columnwise=1))
    _raises(TypeError, "dequantize: from_columnwise=None must be True or False",
            lambda: fj.dequantize(_st(), from_columnwise=None))
    st, _ = fj.quantize_current_scaling(X, amax_epsilon=np.float32(0.5), power_2_scale=np.True_)
    assert st.data.shape == X.shape  # NumPy scalars are numbers and bools too


# --- delayed scaling: state and update arguments --------------------------------------

RECIPE = DelayedScaling(amax_history_len=4)


def _state(**fields):
    s = fj.DelayedScalingState.create(RECIPE)
    return fj.DelayedScalingState(**{**dict(amax_history=s.amax_history, scale=s.scale,
                                            seeded=s.seeded), **fields})


@pytest.mark.parametrize("field, value, exc, match", [
    ("amax_history", jnp.zeros((3, 4), jnp.float16), TypeError,
     "state.amax_history has dtype float16"),
    ("scale", np.ones(3), TypeError, "state.scale has dtype float64"),
    ("seeded", jnp.zeros(3, jnp.int32), TypeError, "state.seeded has dtype int32"),
    ("seeded", jnp.zeros(3, bool), TypeError, "state.seeded has dtype bool"),
    ("seeded", [0.0, 0.0, 0.0], TypeError, "state.seeded is a list"),
    ("seeded", None, TypeError, "state.seeded is a NoneType"),
    ("scale", jnp.ones((1, 3)), ValueError, r"state has .* shapes .*\(1, 3\)"),
    ("amax_history", jnp.zeros((3, 5)), ValueError, r"state has .* recipe needs \(3, 4\)"),
])
def test_dense_state_fields(field, value, exc, match):
    state = _state(**{field: value})
    _raises(exc, "fp8kit.jax.dense: " + match,
            lambda: fj.dense(X, W, state=state, recipe=RECIPE))


def test_delayed_scaling_update_arguments():
    h, a, s = np.zeros((1, 4), F32), np.ones(1, F32), np.ones(1, F32)
    _raises(TypeError, "margin must be an int >= 0 and <= 126, got True",
            lambda: fj.delayed_scaling_update(h, a, s, ["e4m3"], margin=True))
    _raises(ValueError, f"margin must be an int >= 0 and <= {_ffi.MARGIN_MAX}, got 127",
            lambda: fj.delayed_scaling_update(h, a, s, ["e4m3"], margin=127))
    _raises(ValueError, "margin must be an int", lambda: fj.delayed_scaling_update(
        h, a, s, ["e4m3"], margin=2**40))
    _raises(TypeError, "fp8_dtypes='e4m3' must be a list of formats",
            lambda: fj.delayed_scaling_update(h, a, s, "e4m3"))
    too_long = jax.ShapeDtypeStruct((1, _ffi.AMAX_HISTORY_LEN_MAX + 1), jnp.float32)
    with pytest.raises(ValueError, match="history length.* must be an int >= 1 and <= 1048576"):
        jax.eval_shape(lambda h: fj.delayed_scaling_update(h, a, s, ["e4m3"]), too_long)


def test_recipe_objects():
    _raises(TypeError, "dense: recipe must be", lambda: fj.dense(X, W, recipe=DelayedScaling))
    _raises(TypeError, "dense: recipe must be", lambda: fj.dense(X, W, recipe=None))
    with pytest.raises(TypeError, match="DelayedScalingState.create: recipe must be"):
        fj.DelayedScalingState.create(CurrentScaling())


# --- what still works: 0-size, rank 0, transposed and NaN inputs -----------------------

def test_edge_inputs_are_not_errors():
    assert fj.quantize(jnp.float32(3.0), F32(1.0), columnwise=True).columnwise_data.shape == (1, 1)
    st = fj.quantize(jnp.ones((0, 32)), F32(1.0), "e4m3", True, True)
    assert st.data.shape == (0, 32) and st.columnwise_data.shape == (32, 0)
    t = jnp.asarray(np.arange(32 * 16, dtype=F32).reshape(32, 16)).T  # a transposed view
    np.testing.assert_array_equal(
        np.asarray(fj.quantize(t, F32(0.01)).data).view(np.uint8),
        np.asarray(fj.quantize(jnp.asarray(np.ascontiguousarray(np.asarray(t))), F32(0.01))
                   .data).view(np.uint8))
    w_grad = jax.grad(lambda w: jnp.sum(fj.dense(jnp.ones((0, 32)), w, recipe=CurrentScaling())))(W)
    np.testing.assert_array_equal(np.asarray(w_grad), 0.0)
    # A NaN amax gives current scaling's fallback scale 1: the NaN stays in its row.
    y = np.asarray(fj.dense(X.at[0, 0].set(jnp.nan), W, recipe=CurrentScaling()), np.float32)
    assert np.isnan(y[0]).all() and np.isfinite(y[1:]).all()
