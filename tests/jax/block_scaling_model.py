"""A NumPy model of block-scaled FP8 quantization, written from the rule and
the scale layout that common/include/fp8kit/block_scaling.h documents (not
from the core's code): what the JAX tests compare the custom calls against.

Per block, in float32 with one rounding per operation: amax = max |x| (NaN
if any is NaN); amax 0, NaN or +inf -> scale 1; else scale = fp8_max /
max(amax, eps), FLT_MAX if that overflows, rounded down to a power of two
under power_2_scale but not below fp8_max / FLT_MAX (then doubled); q =
saturate(rne(x * scale)) for finite x, NaN -> 0x7F, +-inf -> 0x7F (E4M3)
or +-inf (E5M2); scale_inv = 1 / scale.
"""

import ml_dtypes
import numpy as np

BLOCK = 128
FP8 = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}


def view_2d(x):
    x = np.asarray(x)
    return x.reshape(-1, x.shape[-1] if x.ndim else 1)


def _block_scales(amax, fmt, eps, power_2_scale):
    """float32 scale per block from float32 amaxes."""
    f32 = np.float32
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        scale = f32(FP8_MAX[fmt]) / np.maximum(amax, f32(eps))
    scale = np.where(np.isinf(scale), np.finfo(f32).max, scale).astype(f32)
    if power_2_scale:
        scale = (scale.view(np.uint32) & np.uint32(0xFF800000)).view(f32)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            over = FP8_MAX[fmt] / scale.astype(np.float64) > np.finfo(f32).max
            scale = np.where(over, scale * f32(2), scale)
    unscaled = (amax == 0) | ~np.isfinite(amax)
    return np.where(unscaled, f32(1), scale).astype(f32)


def cast(v, fmt):
    """saturate(rne(v)) to FP8 bits for finite v, NaN -> 0x7F, +-inf (only an
    infinite x gives one here) -> 0x7F (E4M3) or +-inf (E5M2)."""
    fmax = np.float32(FP8_MAX[fmt])
    clipped = np.where(np.isinf(v), v, np.clip(v, -fmax, fmax))
    bits = clipped.astype(FP8[fmt]).view(np.uint8)
    return np.where(np.isnan(v) | (np.isinf(v) & (fmt == "e4m3")), np.uint8(0x7F), bits)


def quantize_copy(stored, mode, fmt, eps=0.0, power_2_scale=True):
    """One stored copy [R, C] (float32): (FP8 bits [R, C], scale_inv array
    [outer, inner] in the documented layout, padding 0)."""
    stored = np.asarray(stored, np.float32)
    r, c = stored.shape
    tile_rows = 1 if mode == "block_1x128" else BLOCK
    rb, cb = -(-r // tile_rows), -(-c // BLOCK)
    padded = np.zeros((rb * tile_rows, cb * BLOCK), np.float32)
    padded[:r, :c] = stored
    tiles = np.abs(padded).reshape(rb, tile_rows, cb, BLOCK)
    with np.errstate(invalid="ignore"):
        amax = tiles.max(axis=(1, 3))  # NaN-propagating, [rb, cb]
    scale = _block_scales(amax, fmt, eps, power_2_scale)
    per_element = np.repeat(np.repeat(scale, tile_rows, 0), BLOCK, 1)[:r, :c]
    with np.errstate(invalid="ignore"):  # signaling-NaN inputs stay NaN
        q = cast((stored * per_element).astype(np.float32), fmt)
    scale_inv = (np.float32(1) / scale).astype(np.float32)
    if mode == "block_1x128":  # [ceil(C/128), round_up(R, 4)], tile (r, j) at [j, r]
        layout = np.zeros((cb, -(-r // 4) * 4), np.float32)
        layout[:, :r] = scale_inv.T
    else:  # [ceil(R/128), round_up(ceil(C/128), 4)], block (i, j) at [i, j]
        layout = np.zeros((rb, -(-cb // 4) * 4), np.float32)
        layout[:, :cb] = scale_inv
    return q, layout


def quantize(x, mode, fmt="e4m3", eps=0.0, power_2_scale=True):
    """Both copies of x: (rowwise bits in x's shape, rowwise scales,
    columnwise bits [last, prod(leading)], columnwise scales)."""
    x2 = view_2d(np.asarray(x, np.float32))
    q, s = quantize_copy(x2, mode, fmt, eps, power_2_scale)
    qc, sc = quantize_copy(x2.T, mode, fmt, eps, power_2_scale)
    return q.reshape(np.shape(x)), s, qc, sc


def dequantize_copy(bits, scales, mode, fmt):
    """float64 values of one stored copy [R, C] from its bits and scales."""
    bits = np.asarray(bits)
    r, c = bits.shape
    values = bits.view(FP8[fmt]).astype(np.float64)
    scales = np.asarray(scales, np.float64)
    if mode == "block_1x128":
        per_element = np.repeat(scales[:, :r].T, BLOCK, 1)[:, :c]
    else:
        cb = -(-c // BLOCK)
        per_element = np.repeat(np.repeat(scales[:, :cb], BLOCK, 0), BLOCK, 1)[:r, :c]
    return values * per_element
