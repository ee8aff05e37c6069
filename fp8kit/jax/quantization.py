"""Per-tensor FP8 quantization through the core: amax, quantize (given
scale), quantize_current_scaling (scale from this tensor's amax),
compute_scale, dequantize.

Scale convention (fp8kit/tensor.h): q = saturate(rne(x * scale)),
x ~= q * scale_inv, scale_inv = 1 / scale. Rounding, saturation (of
finite values only: +-inf becomes NaN in E4M3 and stays +-inf in E5M2)
and NaN handling (NaN -> 0x7F in both formats) are the core's,
bit-identical on CPU and CUDA. Sharded inputs get the global amax (and so
one global scale); see _sharding.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fp8kit.jax import _checks, _ffi
from fp8kit.jax import _sharding_quantize as shq
from fp8kit.jax.block_quantization import check_block_scales
from fp8kit.jax.scaled_tensor import ScaledTensor


def amax(x) -> jax.Array:
    """max |x| over every element of `x` as a float32 scalar.

    x: float32, bfloat16 or float16, any rank up to 8. A NaN anywhere gives
    NaN, an inf gives inf, an empty array gives 0. Works under jit, vmap
    (one amax per example), on CPU and CUDA devices, and sharded (the
    global amax, reduced across devices).
    """
    _checks.high_precision("fp8kit.jax.amax", "x", x)
    _checks.rank("fp8kit.jax.amax", "x", x)
    return shq.amax(jnp.asarray(x))


def quantize(x, scale, fp8_dtype="e4m3", rowwise: bool = True,
             columnwise: bool = False) -> ScaledTensor:
    """Quantize `x` with a given per-tensor `scale` (delayed scaling).

    x:          float32/bfloat16/float16, any rank <= 8.
    scale:      float32 scalar (shape () or (1,)).
    fp8_dtype:  "e4m3" / jnp.float8_e4m3fn or "e5m2" / jnp.float8_e5m2.
    rowwise:    produce `data` (x's shape).
    columnwise: produce `columnwise_data` (the transposed layout) in the same pass.
    Returns a ScaledTensor with scale_inv = 1/scale and amax = max |x|
    (the global amax when x is sharded).

    Bad scale values (the core's policy, fp8kit/quantize.h): a scale that is
    not finite and > 0 (0, negative, +-inf, NaN) is not an error - the
    value is on the device and checking it would sync - but never gives a
    plausible result either: every element of data and columnwise_data is
    the FP8 NaN code and scale_inv is NaN; amax is still max |x|. A
    positive denormal scale is used as it is.
    """
    fn = "fp8kit.jax.quantize"
    fmt, rowwise, columnwise = _checks.quantize_args(fn, x, fp8_dtype, rowwise, columnwise)
    _checks.scalar_f32(fn, "scale", scale)
    x = jnp.asarray(x)
    scale = jnp.reshape(jnp.asarray(scale), ())
    data, columnwise_data, scale_inv, amax_ = shq.quantize(x, scale, fmt, rowwise, columnwise)
    return ScaledTensor(data=data if rowwise else None, scale_inv=scale_inv,
                        columnwise_data=columnwise_data if columnwise else None, amax=amax_,
                        fp8_dtype=fmt)


def quantize_current_scaling(x, fp8_dtype="e4m3", rowwise: bool = True, columnwise: bool = False,
                             amax_epsilon: float = 0.0, power_2_scale: bool = False):
    """Current scaling: scale from this tensor's own amax, then the cast.

    scale = fp8_max / max(amax, amax_epsilon) (rounded down to a power of two
    when power_2_scale); a zero or non-finite amax gives scale 1. A sharded
    x gets one scale from its global amax. Returns (ScaledTensor, scale).
    """
    fn = "fp8kit.jax.quantize_current_scaling"
    fmt, rowwise, columnwise = _checks.quantize_args(fn, x, fp8_dtype, rowwise, columnwise)
    amax_epsilon = _checks.epsilon(fn, "amax_epsilon", amax_epsilon)
    power_2_scale = _checks.flag(fn, "power_2_scale", power_2_scale)
    x = jnp.asarray(x)
    data, columnwise_data, scale, scale_inv, amax_, _ = shq.quantize_current_scaling(
        x, fmt, rowwise, columnwise, amax_epsilon, power_2_scale)
    st = ScaledTensor(data=data if rowwise else None, scale_inv=scale_inv,
                      columnwise_data=columnwise_data if columnwise else None, amax=amax_,
                      fp8_dtype=fmt)
    return st, scale


def compute_scale(amax, fp8_dtype="e4m3", amax_epsilon: float = 0.0,
                  power_2_scale: bool = False):
    """(scale, scale_inv) from an amax, by the core's current-scaling rule.

    For amaxes reduced by the caller (e.g. a pmax across devices) before the
    cast; quantize_current_scaling uses the same rule internally.
    """
    fn = "fp8kit.jax.compute_scale"
    _checks.scalar_f32(fn, "amax", amax)
    fmt = _checks.fp8_dtype(fn, "fp8_dtype", fp8_dtype)
    amax_epsilon = _checks.epsilon(fn, "amax_epsilon", amax_epsilon)
    power_2_scale = _checks.flag(fn, "power_2_scale", power_2_scale)
    return _ffi.compute_scale_call(jnp.reshape(jnp.asarray(amax), ()), fmt, amax_epsilon,
                                   power_2_scale)


def dequantize(st: ScaledTensor, dtype=jnp.float32, from_columnwise: bool = False) -> jax.Array:
    """data * scale_inv in float32, rounded once to `dtype` (float32/bfloat16/
    float16); from_columnwise reads the transposed copy (result in the
    logical layout either way). A block-scaled st multiplies each element
    by its block's scale_inv, from the scales of the copy read."""
    fn = "fp8kit.jax.dequantize"
    if not isinstance(st, ScaledTensor):
        raise TypeError(f"{fn}: st must be an fp8kit.jax.ScaledTensor, got {type(st).__name__}")
    dtype = _checks.high_precision_dtype(fn, "dtype", dtype)
    from_columnwise = _checks.flag(fn, "from_columnwise", from_columnwise)
    st.check(fn, "st")
    if st.block_scaled:
        check_block_scales(fn, "st", st)
    src = st.columnwise_data if from_columnwise else st.data
    if src is None:
        which = "columnwise" if from_columnwise else "rowwise"
        raise ValueError(f"{fn}: st holds no {which} data; quantize with {which}=True or pass "
                         f"from_columnwise={not from_columnwise}")
    if st.block_scaled:
        scales = st.columnwise_block_scale_inv if from_columnwise else st.block_scale_inv
    else:
        scales = jnp.reshape(st.scale_inv, ())
    return _ffi.dequantize_call(src, scales, st.shape, dtype, from_columnwise, st.scaling_mode)
