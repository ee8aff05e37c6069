"""The statistics rows a layer fills when it is asked to (its `statistics`
argument): the cast statistics of each FP8 GEMM operand of one call, in
one float32 array that leaves the layer as that argument's cotangent,
exactly as a delayed-scaling state's update does (delayed_scaling.py).

Row r of a layer's array is the cast of its scaling-state row r (dense and
layernorm_dense: 0 input, 1 kernel, 2 output gradient; layernorm_mlp's six
rows as its state's). Columns, COLUMNS: amax, the per-tensor scale the cast
used (NaN under block scaling), the counts as two float32 halves each
(high and low 16 bits, so that counts past 2^24 stay exact in float32),
error_sq, norm_sq, and the element count. A row whose cast did not run
keeps numel 0.

Why a cotangent: the output gradient is cast in the backward pass, where
a custom_vjp can hand values out only through the cotangents of its
inputs. The forward's rows travel to the backward with the residuals.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from fp8kit.jax import _ffi
from fp8kit.jax.scaled_tensor import ScaledTensor

COLUMNS = ("amax", "scale", "underflow_hi", "underflow_lo", "saturated_hi", "saturated_lo",
           "error_sq", "norm_sq", "numel_hi", "numel_lo")
_HALF = 1 << 16


def _halves(count):
    """(high, low) 16-bit halves of a uint32 count, as float32."""
    count = jnp.asarray(count, jnp.uint32)
    return (count >> 16).astype(jnp.float32), (count & (_HALF - 1)).astype(jnp.float32)


def record(rows, row: int, x, scaled: ScaledTensor, numel: int):
    """rows with row `row` set to the statistics of the cast of x into
    `scaled` (its rowwise copy where held, else its columnwise one); x may
    hold zero rows of padding beyond the numel real elements (they count
    in neither the underflow, the saturation nor the sums)."""
    if rows is None:
        return None
    columnwise = scaled.data is None
    data = scaled.columnwise_data if columnwise else scaled.data
    if scaled.block_scaled:
        scales = scaled.columnwise_block_scale_inv if columnwise else scaled.block_scale_inv
        scale = jnp.float32(jnp.nan)
    else:
        scales = jnp.reshape(jnp.asarray(scaled.scale_inv, jnp.float32), ())
        scale = 1.0 / scales
    stats = _ffi.cast_statistics_call(x, data, scales, columnwise, scaled.scaling_mode)
    return rows.at[row].set(_values(stats, scale, numel))


def record_parts(rows, row: int, parts, scaling_mode: str, numel: int):
    """rows with row `row` set to the statistics of one cast made of
    `parts`, [(x, rowwise copy, scales)] each read with `scaling_mode`
    ("per_row" or a block mode): a grouped cast, merged over its parts
    (amax the largest, NaN if any is; counts and sums added). Its experts
    each have their own scale, so the row holds none (NaN)."""
    stats = [_ffi.cast_statistics_call(x, d, s, False, scaling_mode) for x, d, s in parts]
    amax, underflow, saturated, error_sq, norm_sq = (jnp.stack(c) for c in zip(*stats))
    merged = (jnp.max(amax), jnp.sum(underflow, dtype=jnp.uint32),
              jnp.sum(saturated, dtype=jnp.uint32), jnp.sum(error_sq), jnp.sum(norm_sq))
    return rows.at[row].set(_values(merged, jnp.float32(jnp.nan), numel))


def _values(stats, scale, numel: int):
    amax, underflow, saturated, error_sq, norm_sq = stats
    return jnp.stack([amax, scale, *_halves(underflow), *_halves(saturated), error_sq, norm_sq,
                      *_halves(np.uint32(numel))])


def read(rows) -> list[dict]:
    """The rows as host numbers: one dict per row (COLUMNS' quantities,
    counts whole), None for a row whose cast did not run."""
    a = np.asarray(rows, np.float64)
    out = []
    for r in a:
        v = dict(zip(COLUMNS, r))
        numel = int(v["numel_hi"]) * _HALF + int(v["numel_lo"])
        if numel == 0:
            out.append(None)
            continue
        scale = v["scale"]
        out.append({"amax": float(v["amax"]), "scale": None if np.isnan(scale) else float(scale),
                    "underflow": int(v["underflow_hi"]) * _HALF + int(v["underflow_lo"]),
                    "saturated": int(v["saturated_hi"]) * _HALF + int(v["saturated_lo"]),
                    "error_sq": float(v["error_sq"]), "norm_sq": float(v["norm_sq"]),
                    "numel": numel})
    return out


def check(fn: str, rows, num_linears: int):
    """rows as a layer takes them: None, or a float32 [3 * num_linears,
    len(COLUMNS)] array (statistics_rows(num_linears))."""
    if rows is None:
        return None
    want = (3 * num_linears, len(COLUMNS))
    shape = getattr(rows, "shape", None)
    if shape is None or tuple(shape) != want or jnp.dtype(rows.dtype) != jnp.float32:
        what = (f"an array of shape {tuple(shape)} and dtype {rows.dtype}" if shape is not None
                else type(rows).__name__)
        raise ValueError(f"{fn}: statistics is {what}; pass None or "
                         f"fp8kit.jax.statistics_rows({num_linears}) (float32 {want})")
    return rows
