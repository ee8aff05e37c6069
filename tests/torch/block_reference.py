"""Reference model of block-scaled FP8 for the fp8kit.torch tests, written
from common/include/fp8kit/block_scaling.h and independent of fp8kit:
NumPy float32 arithmetic (each operation one correctly rounded IEEE
operation, as the header specifies), ml_dtypes' FP8 conversions, and float64
for the GEMM references.

Per block: amax = max |x| (NaN if any NaN); zero, NaN or inf amax -> scale 1;
else scale = fp8_max / max(amax, eps), FLT_MAX on overflow, mantissa bits
cleared with power_2_scale but not below fp8_max / FLT_MAX (then doubled);
q = saturate(rne(x * scale)) (NaN -> 0x7F, +-inf -> 0x7F in E4M3, +-inf
in E5M2); scale_inv = 1 / scale. Scale layout of a stored copy
[R, C]: 1x128 [ceil(C/128), round_up(R, 4)] with tile (r, j) at [j, r];
128x128 [ceil(R/128), round_up(ceil(C/128), 4)] with block (i, j) at [i, j];
padding 0.
"""

import ml_dtypes
import numpy as np
import torch

ML_DTYPE = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
FP8_MAX = {k: np.float32(ml_dtypes.finfo(v).max) for k, v in ML_DTYPE.items()}
TORCH_FP8_NAME = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}
L = 128
FLT_MAX = np.finfo(np.float32).max


def _ceil(a, b):
    return -(-a // b)


def stored_copy(x: torch.Tensor, columnwise: bool) -> np.ndarray:
    """x as float32 [rows, cols] = [prod(shape[:-1]), shape[-1]] (rank 0 as
    [1, 1]), or its transpose for the columnwise copy."""
    a = x.detach().cpu().float().numpy()
    a = a.reshape(1, 1) if a.ndim == 0 else a.reshape(-1, a.shape[-1])
    return np.ascontiguousarray(a.T if columnwise else a)


def block_amax(a: np.ndarray, mode: str) -> np.ndarray:
    """max |x| per block of a stored copy [R, C] ([R, ceil(C/128)] for 1x128,
    [ceil(R/128), ceil(C/128)] for 128x128), NaN-propagating."""
    rows, cols = a.shape
    pr = _ceil(rows, L) * L if mode == "block_128x128" else rows
    nj = _ceil(cols, L)
    padded = np.zeros((pr, nj * L), np.float32)  # zeros leave every amax as it is
    padded[:rows, :cols] = np.abs(a)
    if mode == "block_1x128":
        return padded.reshape(pr, nj, L).max(axis=2, initial=0)
    return padded.reshape(pr // L, L, nj, L).max(axis=(1, 3), initial=0)


def block_scale(amax: np.ndarray, fmt: str, eps: float, pow2: bool) -> np.ndarray:
    amax = amax.astype(np.float32)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        s = FP8_MAX[fmt] / np.maximum(amax, np.float32(eps))
    s = np.where(np.isinf(s), FLT_MAX, s).astype(np.float32)
    if pow2:
        s = (s.view(np.uint32) & np.uint32(0xFF800000)).view(np.float32)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            s = np.where(FP8_MAX[fmt] / s.astype(np.float64) > FLT_MAX, s * np.float32(2), s)
    bad = ~np.isfinite(amax) | (amax == 0)
    return np.where(bad, np.float32(1), s).astype(np.float32)


def cast_bits(xs: np.ndarray, fmt: str) -> np.ndarray:
    """uint8 bits of saturate(rne(xs)): NaN -> 0x7F, finite beyond +-max ->
    +-max, +-inf (from an infinite x: a block's scale never makes a finite
    x's product overflow) -> 0x7F in E4M3, +-inf in E5M2."""
    m = FP8_MAX[fmt]
    bits = np.where(np.isinf(xs), xs, np.clip(xs, -m, m)).astype(ML_DTYPE[fmt])
    bits = bits.view(np.uint8).copy()
    bits[np.isnan(xs) | (np.isinf(xs) & (fmt == "e4m3"))] = 0x7F
    return bits


def scale_layout(scale_inv: np.ndarray, mode: str) -> np.ndarray:
    """A copy's per-block scale_inv ([R, nj] or [ni, nj]) in the core's layout."""
    if mode == "block_1x128":
        rows, nj = scale_inv.shape
        out = np.zeros((nj, _ceil(rows, 4) * 4), np.float32)
        out[:, :rows] = scale_inv.T
    else:
        ni, nj = scale_inv.shape
        out = np.zeros((ni, _ceil(nj, 4) * 4), np.float32)
        out[:, :nj] = scale_inv
    return out


def quantize(x: torch.Tensor, fmt: str, mode: str, columnwise: bool, eps: float = 0.0,
             pow2: bool = True):
    """(bits [R, C] uint8 of the stored copy, its block scales in the core's
    layout)."""
    a = stored_copy(x, columnwise)
    rows, cols = a.shape
    scale = block_scale(block_amax(a, mode), fmt, eps, pow2)
    if mode == "block_1x128":
        per_elem = np.repeat(scale, L, axis=1)[:, :cols]
    else:
        per_elem = np.repeat(np.repeat(scale, L, axis=0), L, axis=1)[:rows, :cols]
    with np.errstate(over="ignore", invalid="ignore"):
        xs = a * per_elem  # float32 multiply
    scale_inv = (np.float32(1) / scale).astype(np.float32)
    return cast_bits(xs, fmt), scale_layout(scale_inv, mode)


def dequantize_stored(bits: np.ndarray, scales: np.ndarray, fmt: str, mode: str) -> np.ndarray:
    """float64 values of a stored copy [R, C] from its bits and scale layout
    (each element times its block's scale_inv, exact in float64)."""
    rows, cols = bits.shape
    q = bits.view(ML_DTYPE[fmt]).astype(np.float64)
    j = np.arange(cols) // L
    if mode == "block_1x128":
        s = scales[j[None, :], np.arange(rows)[:, None]]
    else:
        s = scales[(np.arange(rows) // L)[:, None], j[None, :]]
    return q * s.astype(np.float64)


def fake_quantize(x: torch.Tensor, fmt: str, mode: str, columnwise: bool = False,
                  eps: float = 0.0, pow2: bool = True) -> np.ndarray:
    """float64 [rows, cols] values that x's stored copy dequantizes to (the
    columnwise copy transposed back)."""
    bits, scales = quantize(x, fmt, mode, columnwise, eps, pow2)
    v = dequantize_stored(bits, scales, fmt, mode)
    return v.T if columnwise else v


def bits_of(q: torch.Tensor) -> np.ndarray:
    return q.detach().cpu().view(torch.uint8).numpy()


def assert_bits_equal(got: torch.Tensor, want: np.ndarray, x: np.ndarray, what: str):
    """Bit-exact; on failure names the first mismatching lanes."""
    g = bits_of(got).reshape(want.shape)
    bad = np.argwhere(g != want)
    if bad.size:
        lanes = ", ".join(f"[{r},{c}] x={x[r, c]!r} got=0x{g[r, c]:02x} want=0x{want[r, c]:02x}"
                          for r, c in bad[:6])
        raise AssertionError(f"{what}: {len(bad)} of {want.size} lanes differ: {lanes}")
