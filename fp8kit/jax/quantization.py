"""Per-tensor FP8 quantization through the core: quantize (given scale),
quantize_current_scaling (scale from this tensor's amax), compute_scale,
dequantize.

Scale convention (fp8kit/tensor.h): q = saturate(rne(x * scale)),
x ~= q * scale_inv, scale_inv = 1 / scale. Rounding, saturation (inf
included) and NaN handling (NaN -> 0x7F in both formats) are the core's,
bit-identical on CPU and CUDA.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fp8kit.jax import _checks, _registry
from fp8kit.jax.scaled_tensor import ScaledTensor, columnwise_shape

QUANTIZE_TARGET = "fp8kit_quantize"
QUANTIZE_CURRENT_TARGET = "fp8kit_quantize_current_scaling"
COMPUTE_SCALE_TARGET = "fp8kit_compute_scale"
DEQUANTIZE_TARGET = "fp8kit_dequantize"

_F32_SCALAR = jax.ShapeDtypeStruct((), jnp.float32)
# Stands in for an output that was not asked for (the handler leaves it alone).
_PLACEHOLDER = (0,)


def _fp8_results(shape, fp8_dtype: str, rowwise: bool, columnwise: bool):
    dt = _checks.FP8_DTYPES[fp8_dtype]
    return (jax.ShapeDtypeStruct(tuple(shape) if rowwise else _PLACEHOLDER, dt),
            jax.ShapeDtypeStruct(columnwise_shape(shape) if columnwise else _PLACEHOLDER, dt))


def _check_quantize_args(fn, x, fp8_dtype, rowwise, columnwise) -> str:
    _checks.high_precision(fn, "x", x)
    _checks.rank(fn, "x", x)
    fmt = _checks.fp8_dtype(fn, "fp8_dtype", fp8_dtype)
    if not (rowwise or columnwise):
        raise ValueError(f"{fn}: rowwise and columnwise are both False; ask for at least one "
                         "layout (rowwise for x @ w, columnwise for the transposed use in a "
                         "backward GEMM).")
    return fmt


def quantize_call(x, scale, fmt: str, rowwise: bool, columnwise: bool):
    """Raw custom call: (data, columnwise, scale_inv, amax), placeholders kept."""
    return jax.ffi.ffi_call(
        QUANTIZE_TARGET,
        (*_fp8_results(x.shape, fmt, rowwise, columnwise), _F32_SCALAR, _F32_SCALAR),
        vmap_method="sequential",
    )(x, scale, rowwise=bool(rowwise), columnwise=bool(columnwise))


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
    """
    fn = "fp8kit.jax.quantize"
    fmt = _check_quantize_args(fn, x, fp8_dtype, rowwise, columnwise)
    _checks.scalar_f32(fn, "scale", scale)
    from fp8kit.jax import partitioning  # noqa: PLC0415  (it imports this module)

    x = jnp.asarray(x)
    scale = jnp.reshape(jnp.asarray(scale), ())
    data, col, scale_inv, amax = partitioning.quantize(x, scale, fmt, rowwise, columnwise)
    return ScaledTensor(data=data if rowwise else None, scale_inv=scale_inv,
                        columnwise_data=col if columnwise else None, amax=amax, fp8_dtype=fmt)


def quantize_current_scaling_call(x, fmt: str, rowwise: bool, columnwise: bool,
                                  amax_epsilon: float, power_2_scale: bool):
    """Raw custom call: (data, columnwise, scale, scale_inv, amax)."""
    return jax.ffi.ffi_call(
        QUANTIZE_CURRENT_TARGET,
        (*_fp8_results(x.shape, fmt, rowwise, columnwise), _F32_SCALAR, _F32_SCALAR, _F32_SCALAR),
        vmap_method="sequential",
    )(x, rowwise=bool(rowwise), columnwise=bool(columnwise),
      amax_epsilon=np.float32(amax_epsilon), force_pow2_scale=bool(power_2_scale))


def quantize_current_scaling(x, fp8_dtype="e4m3", rowwise: bool = True, columnwise: bool = False,
                             amax_epsilon: float = 0.0, power_2_scale: bool = False):
    """Current scaling: scale from this tensor's own amax, then the cast.

    scale = fp8_max / max(amax, amax_epsilon) (rounded down to a power of two
    when power_2_scale); a zero or non-finite amax gives scale 1. A sharded
    x gets one scale from its global amax. Returns (ScaledTensor, scale).
    """
    fn = "fp8kit.jax.quantize_current_scaling"
    fmt = _check_quantize_args(fn, x, fp8_dtype, rowwise, columnwise)
    if not (float(amax_epsilon) >= 0.0):
        raise ValueError(f"{fn}: amax_epsilon must be >= 0, got {amax_epsilon!r}")
    from fp8kit.jax import partitioning  # noqa: PLC0415  (it imports this module)

    x = jnp.asarray(x)
    data, col, scale, scale_inv, amax = partitioning.quantize_current_scaling(
        x, fmt, rowwise, columnwise, amax_epsilon, power_2_scale)
    st = ScaledTensor(data=data if rowwise else None, scale_inv=scale_inv,
                      columnwise_data=col if columnwise else None, amax=amax, fp8_dtype=fmt)
    return st, scale


def compute_scale_call(amax, fmt: str, amax_epsilon: float, power_2_scale: bool):
    return jax.ffi.ffi_call(COMPUTE_SCALE_TARGET, (_F32_SCALAR, _F32_SCALAR),
                            vmap_method="sequential")(
        amax, fp8_dtype=np.int32(_registry.ext.FP8_DTYPE_CODES[fmt]),
        amax_epsilon=np.float32(amax_epsilon), force_pow2_scale=bool(power_2_scale))


def compute_scale(amax, fp8_dtype="e4m3", amax_epsilon: float = 0.0,
                  power_2_scale: bool = False):
    """(scale, scale_inv) from an amax, by the core's current-scaling rule.

    For amaxes reduced by the caller (e.g. a pmax across devices) before the
    cast; quantize_current_scaling uses the same rule internally.
    """
    fn = "fp8kit.jax.compute_scale"
    _checks.scalar_f32(fn, "amax", amax)
    fmt = _checks.fp8_dtype(fn, "fp8_dtype", fp8_dtype)
    return compute_scale_call(jnp.reshape(jnp.asarray(amax), ()), fmt, amax_epsilon,
                              power_2_scale)


def dequantize_call(data, scale_inv, shape, dtype, from_columnwise: bool):
    return jax.ffi.ffi_call(DEQUANTIZE_TARGET, jax.ShapeDtypeStruct(tuple(shape), dtype),
                            vmap_method="sequential")(
        data, scale_inv, from_columnwise=bool(from_columnwise))


def dequantize(st: ScaledTensor, dtype=jnp.float32, from_columnwise: bool = False) -> jax.Array:
    """data * scale_inv in float32, rounded once to `dtype` (float32/bfloat16/
    float16); from_columnwise reads the transposed copy (result in the
    logical layout either way)."""
    fn = "fp8kit.jax.dequantize"
    if not isinstance(st, ScaledTensor):
        raise TypeError(f"{fn}: st must be an fp8kit.jax.ScaledTensor, got {type(st).__name__}")
    dtype = _checks.high_precision_dtype(fn, "dtype", dtype)
    src = st.columnwise_data if from_columnwise else st.data
    if src is None:
        which = "columnwise" if from_columnwise else "rowwise"
        raise ValueError(f"{fn}: st holds no {which} data; quantize with {which}=True or pass "
                         f"from_columnwise={not from_columnwise}")
    return dequantize_call(src, jnp.reshape(st.scale_inv, ()), st.shape, dtype, from_columnwise)
