"""The independent NumPy reference of fp8kit's per-tensor FP8 math, and of
the statistics of a cast (per-tensor or block-scaled copy), shared by the
PyTorch tests (tests/torch), the JAX tests (tests/jax) and the hardening
suite (tests/hardening).

Independent: NumPy (float32 where the contract says float32, float64 for
GEMMs) and ml_dtypes' FP8 conversions only. Nothing here imports fp8kit,
torch or jax, so a bug in fp8kit (or in a front end's conversions) cannot
hide in its own reference; the front ends' tests turn their tensors into
NumPy arrays first (tests/torch/torch_reference.py does it for torch).

The contract under test, as documented in common/include/fp8kit/tensor.h,
quantize.h, delayed_scaling.h, column_sums.h, statistics.h (with
block_scaling.h's scale layout) and common/src/compute_scale.h (and
fp8kit/recipe.py's module docstring):
  q = saturate(round_to_nearest_even(x * scale)) with x * scale one float32
  multiply, saturating for finite x only (+-inf gives NaN in E4M3, +-inf in
  E5M2) and NaN giving the canonical NaN byte 0x7F in both formats;
  scale_inv = 1 / scale in float32.
  A given scale that is not finite and > 0 (0, negative, +-inf, NaN) makes
  every output element NaN (0x7F) and scale_inv NaN.
  A computed scale (current or delayed scaling) is clamped to
  [FLT_MIN, FLT_MAX]; an amax that is zero, negative or not finite never
  becomes a scale (current scaling uses 1, delayed scaling keeps the
  previous scale).

Tests find this module as `import fp8_reference`: tests/conftest.py puts
tests/ on sys.path under pytest, and the py_library //tests:fp8_reference
(imports = ["."]) does under Bazel.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

F32 = np.float32
ML_FP8 = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
FP8_MAX = {k: float(ml_dtypes.finfo(v).max) for k, v in ML_FP8.items()}
CANONICAL_NAN = np.uint8(0x7F)
FLT_MAX = F32(np.finfo(np.float32).max)
FLT_MIN = F32(np.finfo(np.float32).tiny)   # smallest normal float32
# Rounding to each high-precision output type (round to nearest): at most
# this fraction of the value for normal results, and at most half the
# smallest subnormal below the normal range.
HALF_ULP = {"float32": 2.0 ** -24, "bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}
HALF_SUBNORMAL = {"float32": 2.0 ** -150, "bfloat16": 2.0 ** -134, "float16": 2.0 ** -25}
HP_NUMPY = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def valid_scale(scale) -> bool:
    """A user-given scale fp8kit casts with: finite and > 0 (a positive
    denormal included); any other makes the cast NaN (quantize.h)."""
    s = F32(scale)
    return bool(np.isfinite(s) and s > 0)


def quantize_bits(x, scale, fmt: str) -> np.ndarray:
    """uint8 FP8 bits of x (any float array, taken as float32) quantized
    with `scale`: ml_dtypes' round-to-nearest-even conversion of x * scale
    (one float32 multiply), clipped to +-fp8_max where x is finite (a
    product past FLT_MAX included); an infinite x stays inf (E5M2) or
    becomes NaN (E4M3); NaN lanes get the canonical 0x7F, and so does every
    lane for a scale that is not finite and > 0."""
    x32 = np.asarray(x, dtype=np.float32)
    if not valid_scale(scale):
        return np.full(x32.shape, CANONICAL_NAN, np.uint8)
    with np.errstate(over="ignore", invalid="ignore"):
        y = x32 * F32(scale)                      # one float32 multiply
    m = F32(FP8_MAX[fmt])
    y = np.where(np.isinf(x32), y, np.clip(y, -m, m))  # saturate finite x only
    bits = y.astype(ML_FP8[fmt]).view(np.uint8)
    nan = np.isnan(y) | (np.isinf(y) & (fmt == "e4m3"))  # E4M3 has no inf
    return np.where(nan, CANONICAL_NAN, bits).astype(np.uint8)


def quantize_dequantize(x, scale, fmt: str) -> np.ndarray:
    """float64 values of quantize_bits(x, scale, fmt) times scale_inv (the
    float32 1 / scale): the operand an FP8 GEMM sees."""
    return decode(quantize_bits(x, scale, fmt), fmt) * np.float64(scale_inv_for_given(scale))


def view_2d(shape) -> tuple[int, int]:
    """The [prod(leading), last] view of a logical shape (a scalar is [1, 1])."""
    shape = tuple(shape)
    last = shape[-1] if shape else 1
    return (math.prod(shape[:-1]), last)


def columnwise_shape(shape) -> tuple[int, int]:
    rows, cols = view_2d(shape)
    return (cols, rows)


def columnwise_bits(rowwise_bits: np.ndarray) -> np.ndarray:
    """The columnwise copy: the 2-D view transposed, contiguous."""
    return np.ascontiguousarray(rowwise_bits.reshape(view_2d(rowwise_bits.shape)).T)


def reciprocal(scale) -> np.float32:
    """scale_inv = 1 / scale in float32 (NaN for a NaN scale)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return F32(F32(1.0) / F32(scale))


def scale_inv_for_given(scale) -> np.float32:
    """The scale_inv a quantization with a user-given scale reports."""
    return reciprocal(scale) if valid_scale(scale) else F32(np.nan)


def amax(x) -> np.float32:
    """max |x|, NaN if any NaN, 0 for an empty array."""
    a = np.abs(np.asarray(x, dtype=np.float64))
    if a.size == 0:
        return F32(0.0)
    if np.isnan(a).any():
        return F32(np.nan)
    return F32(a.max())


def _clamp_scale(s: np.float32) -> np.float32:
    """A computed scale kept usable: overflow -> FLT_MAX, zero or denormal -> FLT_MIN."""
    if not np.isfinite(s):
        return FLT_MAX
    if s < FLT_MIN:
        return FLT_MIN
    return F32(s)


def current_scale(amax_value, fmt: str, epsilon: float = 0.0, pow2: bool = False) -> np.float32:
    """Current scaling: fp8_max / max(amax, eps) in float32, clamped; 1 for
    an amax that is zero, negative or not finite. pow2: rounded down to a
    power of two (mantissa cleared), doubled where fp8_max * scale_inv
    would pass FLT_MAX."""
    a = F32(amax_value)
    if not np.isfinite(a) or not a > 0:
        return F32(1.0)
    denom = max(a, F32(epsilon))
    with np.errstate(over="ignore", divide="ignore"):
        s = _clamp_scale(F32(F32(FP8_MAX[fmt]) / F32(denom)))
    if pow2:
        s = np.array([s], np.float32).view(np.uint32)
        s = (s & np.uint32(0xFF800000)).view(np.float32)[0]
        if FP8_MAX[fmt] / np.float64(s) > FLT_MAX:  # fp8_max * scale_inv must stay finite
            s = F32(2) * s
    return F32(s)


def delayed_scale(amax_reduced, previous_scale, fmt: str, margin: int) -> np.float32:
    """Delayed scaling's scale: (fp8_max / amax_reduced) * 2**-margin, each
    step one float32 operation, clamped; the previous scale when
    amax_reduced is zero, negative or not finite. Also the seed scale of a
    fresh delayed slot (fp8kit_quantize_delayed_update), with its own amax.
    Never below fp8_max / FLT_MAX (float32), where fp8_max would
    dequantize to inf."""
    a = F32(amax_reduced)
    if not np.isfinite(a) or not a > 0:
        return F32(previous_scale)
    with np.errstate(over="ignore", under="ignore", divide="ignore"):
        s = F32(F32(FP8_MAX[fmt]) / a) * F32(2.0 ** -margin)
    return max(_clamp_scale(F32(s)), F32(F32(FP8_MAX[fmt]) / FLT_MAX))


def delayed_update(history, new_amax, scale, fmts, margin: int, reduction):
    """n tensors' delayed-scaling update (fp8kit_delayed_scaling_update), on
    copies: roll each history (column 0 newest) with new_amax, reduce it
    ("max", NaN-propagating, or "most_recent"; an AmaxReduction works too),
    delayed_scale of that with the previous scale. history [n, L],
    new_amax [n], scale [n], fmts n names. Returns (history, scale,
    scale_inv) as float32 arrays."""
    reduction = getattr(reduction, "value", reduction)
    if reduction not in ("max", "most_recent"):
        raise ValueError(f"unknown amax reduction {reduction!r}")
    old = np.asarray(history, np.float32)
    h = np.array(old, dtype=np.float32, copy=True)
    n = h.shape[0]
    h[:, 1:] = old[:, :-1]
    h[:, 0] = np.asarray(new_amax, np.float32)
    previous = np.broadcast_to(np.asarray(scale, np.float32), (n,))
    out_scale = np.empty(n, np.float32)
    for i in range(n):
        if reduction == "max":
            red = F32(np.nan) if np.isnan(h[i]).any() else F32(h[i].max())
        else:
            red = h[i, 0]
        out_scale[i] = delayed_scale(red, previous[i], fmts[i], margin)
    return h, out_scale, np.array([reciprocal(s) for s in out_scale], np.float32)


def column_sums(a) -> np.ndarray:
    """Column sums of a 2-D array in the core's documented float32 order
    (fp8kit/column_sums.h): rows cut into tiles of 128 and tiles into
    groups of 8; a group sum adds its rows in order to 0, a tile sum its 16
    group sums in order to 0, and each column sum the tile sums in order to
    0."""
    a = np.asarray(a, dtype=np.float32)
    rows, cols = a.shape
    padded = np.zeros((-(-rows // 128) * 128, cols), np.float32)
    padded[:rows] = a
    total = np.zeros(cols, np.float32)
    for tile in padded.reshape(-1, 16, 8, cols):
        tile_sum = np.zeros(cols, np.float32)
        for group in tile:
            group_sum = np.zeros(cols, np.float32)
            for row in group:
                group_sum = group_sum + row
            tile_sum = tile_sum + group_sum
        total = total + tile_sum
    return total


def decode(bits: np.ndarray, fmt: str) -> np.ndarray:
    """FP8 bits -> float64 values."""
    return np.asarray(bits, np.uint8).view(ML_FP8[fmt]).astype(np.float64)


def dequantize(bits: np.ndarray, fmt: str, scale_inv, out: str) -> np.ndarray:
    """q * scale_inv as one float32 multiply, rounded once to `out`."""
    q = np.asarray(bits, np.uint8).view(ML_FP8[fmt]).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        return (q * F32(scale_inv)).astype(HP_NUMPY[out])


def same_floats(got, want) -> np.ndarray:
    """Element-wise: equal values (+0 == -0) or both NaN."""
    g = np.asarray(got, np.float64)
    w = np.asarray(want, np.float64)
    return (g == w) | (np.isnan(g) & np.isnan(w))


def assert_bits_equal(got: np.ndarray, want: np.ndarray, what: str, inputs=None):
    """Exact uint8 comparison naming the first differing lanes."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    bad = np.flatnonzero(got.ravel() != want.ravel())
    if bad.size:
        src = "" if inputs is None else np.asarray(inputs, np.float32).ravel()
        lanes = ", ".join(
            f"[{i}]" + ("" if inputs is None else f" x={src[i]!r}")
            + f" got=0x{int(got.ravel()[i]):02x} want=0x{int(want.ravel()[i]):02x}"
            for i in bad[:6])
        raise AssertionError(f"{what}: {bad.size} of {got.size} lanes differ: {lanes}")


def assert_floats_equal(got, want, what: str):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    ok = same_floats(got, want)
    if not ok.all():
        bad = np.flatnonzero(~ok.ravel())
        lanes = ", ".join(f"[{i}] got={got.ravel()[i]!r} want={want.ravel()[i]!r}"
                          for i in bad[:6])
        raise AssertionError(f"{what}: {bad.size} of {got.size} values differ: {lanes}")


# Unit roundoff of the partial sums of an FP8 GEMM. The CPU reference
# accumulates in float32. Hopper's FP8 tensor cores keep far fewer bits of
# each partial sum before it is promoted to float32: on an H200, 15
# products 2^-11 below the largest one in a K = 16 sum were dropped
# entirely (relative error 2^-7 of sum |a||b|), and normal data gives
# relative errors up to 3e-4 (scripts/accumulation_error.py). 2^-10 per
# addition covers both and still flags any wrong layout or scale.
ACCUMULATION_UNIT = {"cpu": 2.0 ** -24, "cuda": 2.0 ** -10}


def accumulation_bound(a: np.ndarray, b: np.ndarray, device: str) -> np.ndarray:
    """Per-element error allowed between a @ b accumulated on `device` and
    the exact float64 one: K+2 roundings of the partial sums of |a| @ |b|."""
    unit = ACCUMULATION_UNIT[str(device).split(":")[0]]
    return (a.shape[-1] + 2) * unit * (np.abs(a) @ np.abs(b))


def rounding_bound(want: np.ndarray, out: str) -> np.ndarray:
    """The final rounding of a result `want` to the output type `out`."""
    return HALF_ULP[out] * np.abs(want) * 1.0001 + HALF_SUBNORMAL[out]


def gemm_reference(p: dict, device: str, bias=None):
    """(want, bound) of a gemm problem (fp8_strategies.gemm_problems): the
    float64 product of the decoded, scaled operands, plus `bias` (the values
    the GEMM received, float64) added in float32, accumulated on `device`
    and rounded to p["out"]."""
    av = decode(p["a"], p["fa"]) * np.float64(F32(p["sa"]))
    bv = decode(p["b"], p["fb"]) * np.float64(F32(p["sb"]))
    av, bv = (av.T if p["trans_a"] else av), (bv.T if p["trans_b"] else bv)
    with np.errstate(invalid="ignore", over="ignore"):
        want = av @ bv
        bound = accumulation_bound(av, bv, device)
        if bias is not None:
            want = want + bias
            bound = bound + (np.abs(want) + np.abs(bias)) * 2.0 ** -23
        return want, bound + rounding_bound(want, p["out"])


def assert_result_close(got, want, bound, out: str, what: str):
    """A GEMM-like result `got` (in the output type `out`) against the
    float64 `want` within `bound`; where `want` rounded to `out` is not
    finite (NaN, or past the type's range), `got` must be exactly that."""
    got = np.asarray(got, np.float64).reshape(want.shape)
    with np.errstate(over="ignore", invalid="ignore"):
        want_out = want.astype(HP_NUMPY[out]).astype(np.float64)
    exact = ~np.isfinite(want_out)
    assert_floats_equal(got[exact], want_out[exact], f"{what} (non-finite elements)")
    assert_gemm_close(np.where(exact, 0.0, got), np.where(exact, 0.0, want),
                      np.where(exact, 0.0, bound), what)


def assert_gemm_close(got, want, bound, what: str):
    got = np.asarray(got, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    err = np.abs(got - want)
    bad = ~(err <= bound)
    if bad.any():
        i = np.flatnonzero(bad.ravel())
        lanes = ", ".join(f"[{j}] got={got.ravel()[j]!r} want={want.ravel()[j]!r} "
                          f"allowed={bound.ravel()[j]:.3g}" for j in i[:6])
        raise AssertionError(f"{what}: {i.size} of {got.size} elements off: {lanes}")


# --- the statistics of a cast (common/include/fp8kit/statistics.h) ------------------------

BLOCK_LEN = 128
# The header's bound on the float32 sums (each one rounding of a double sum,
# CPU and CUDA adding the terms in different orders).
SUM_RTOL = 1e-5


def element_scale_inv(scale_inv, mode: str, shape, columnwise: bool) -> np.ndarray:
    """float32 [rows, cols] (the 2-D view of `shape`): the scale_inv each
    element of one stored copy is read with. "per_tensor": the one float32.
    Block modes: the copy's scales in the core's layout (block_scaling.h),
    for the stored copy [R, C] ([rows, cols], or [cols, rows] columnwise):
    1x128 tile (r, j) at [j, r], 128x128 block (i, j) at [i, j]."""
    rows, cols = view_2d(shape)
    if mode == "per_tensor":
        return np.full((rows, cols), F32(np.asarray(scale_inv).reshape(())), np.float32)
    scales = np.asarray(scale_inv, np.float32)
    r, c = (cols, rows) if columnwise else (rows, cols)
    stored_r, stored_c = np.arange(r)[:, None], (np.arange(c) // BLOCK_LEN)[None, :]
    if mode == "block_1x128":
        per = scales[stored_c, stored_r]
    elif mode == "block_128x128":
        per = scales[stored_r // BLOCK_LEN, stored_c]
    else:
        raise ValueError(f"unknown scaling mode {mode!r}")
    return per.T if columnwise else per


def logical_bits(bits, shape, columnwise: bool) -> np.ndarray:
    """uint8 FP8 codes of one stored copy in the 2-D view [rows, cols] of
    the tensor's `shape` (the columnwise copy transposed back)."""
    bits = np.asarray(bits, np.uint8)
    rows, cols = view_2d(shape)
    return bits.reshape(cols, rows).T if columnwise else bits.reshape(rows, cols)


def cast_statistics(x, bits, fmt: str, scale_inv) -> dict:
    """The statistics of the cast of x into the FP8 codes `bits` (uint8, one
    per element of x, in x's order), each dequantized as d = q * scale_inv
    in one float32 multiply (`scale_inv` float32, one or one per element):
      amax       max |x| (NaN if any NaN, 0 if empty), float32;
      underflow  #{x finite, x != 0, q = +-0};
      saturated  #{x finite, q = +-fp8_max};
      error_sq   sum over finite x of (d - x)^2, float64;
      norm_sq    sum over finite x of x^2, float64."""
    x64 = np.asarray(x, np.float32).astype(np.float64).ravel()
    q = np.asarray(bits, np.uint8).ravel()
    max_code = np.array(FP8_MAX[fmt], ML_FP8[fmt]).view(np.uint8) & 0x7F
    finite = np.isfinite(x64)
    magnitude = q & 0x7F
    with np.errstate(over="ignore", invalid="ignore"):
        d = (q.view(ML_FP8[fmt]).astype(np.float32)
             * np.broadcast_to(np.asarray(scale_inv, np.float32).ravel(), q.shape))
        error = (d.astype(np.float64) - x64)[finite]
        return dict(amax=amax(x64), underflow=int(np.sum(finite & (x64 != 0) & (magnitude == 0))),
                    saturated=int(np.sum(finite & (magnitude == max_code))),
                    error_sq=float(np.sum(error * error)),
                    norm_sq=float(np.sum(x64[finite] ** 2)))


def assert_cast_statistics(got: dict, want: dict, what: str) -> None:
    """amax exactly (NaN as NaN), the counts exactly, each sum within
    SUM_RTOL of the float64 reference; a sum whose float32 is not finite
    (past FLT_MAX, NaN) must be exactly that."""
    assert same_floats(got["amax"], want["amax"]), \
        f"{what}: amax {got['amax']!r}, expected {want['amax']!r}"
    for count in ("underflow", "saturated"):
        assert int(got[count]) == want[count], \
            f"{what}: {count} {int(got[count])}, expected {want[count]}"
    for total in ("error_sq", "norm_sq"):
        g, w = float(got[total]), want[total]
        with np.errstate(over="ignore"):
            w32 = np.float64(np.float32(w))
        ok = same_floats(g, w32) if not np.isfinite(w32) else abs(g - w) <= SUM_RTOL * abs(w)
        assert ok, f"{what}: {total} {g!r}, expected {w!r} (within {SUM_RTOL:g} relative)"


# Inputs whose counts are known by construction, for both front ends' tests.

def min_subnormal(fmt: str) -> float:
    """The format's smallest subnormal: 2^-9 (E4M3), 2^-16 (E5M2)."""
    return float(ml_dtypes.finfo(ML_FP8[fmt]).smallest_subnormal)


def crafted_per_tensor(fmt: str, scale: float, specials: str):
    """float32 [5, 40] for a cast with a given per-tensor `scale` (1/64 to
    64): values of magnitude 0.5..2.5, in range, with, at known places, 7
    that underflow (far below, below and exactly at half the smallest
    subnormal after scaling, that tie going to even +0), one that rounds up
    to the smallest subnormal, +0 and -0, 3 that saturate (beyond fp8_max,
    exactly -fp8_max, far beyond), one just inside the range, and
    `specials` ("": none, "inf": +-inf, "nan": +-inf and NaN). The counts
    hold for x rounded to bfloat16 too. Returns (x, underflow, saturated)."""
    m, sub = FP8_MAX[fmt], min_subnormal(fmt)
    x = np.array([(-0.5 if i % 2 else 0.5) * (1 + i % 5) for i in range(200)], np.float32)
    placed = [1e-30, sub / 16, -sub / 16, sub / 8, sub / 64, -sub / 8, sub / 2]  # underflow
    placed += [0.75 * sub, 0.0, -0.0]
    scaled = [v / scale for v in placed]
    scaled += [2 * m / scale, -m / scale, 1e6 * m / scale, 0.9 * m / scale]
    scaled += {"": [], "inf": [np.inf, -np.inf], "nan": [np.inf, -np.inf, np.nan]}[specials]
    for k, v in enumerate(scaled):
        x[(k * 37) % x.size] = v  # 37 is prime to 200: distinct places
    return x.reshape(5, 40), 7, 3


def crafted_blocks(fmt: str):
    """float32 [256, 256] whose every 1x128 tile, 128x1 tile and 128x128
    block holds +-fp8_max (its amax), so that every block scale is 1 and the
    counts are a plain cast's: those 512 values and one 2 * fp8_max
    saturate (its tiles and block also hold an inf or a NaN, which makes
    their scale 1 as well), 5 values of a quarter of the smallest subnormal
    underflow, one of 3/4 of it rounds up, +0 and -0 count as neither. The
    counts hold for x rounded to bfloat16 too. Returns (x, underflow,
    saturated)."""
    m, sub = FP8_MAX[fmt], min_subnormal(fmt)
    i = np.arange(256 * 256)
    x = (np.where(i % 3 != 0, 0.5, -1.0) + (i % 97) / 64).astype(np.float32).reshape(256, 256)
    r, c = np.meshgrid(np.arange(256), np.arange(256), indexing="ij")
    diagonal = c % 128 == r % 128
    x[diagonal] = np.where((r + c) % 2 == 1, m, -m)[diagonal]
    x[0, 5], x[3, 7], x[0, 7] = np.inf, np.nan, 2 * m
    flat = x.reshape(-1)
    for k in (1000, 2001, 30000, 40003, 65000):  # off the diagonal
        flat[k] = (-sub if k % 2 else sub) / 4
    flat[50001], flat[50002], flat[50003] = 0.75 * sub, 0.0, -0.0
    return x, 5, int(diagonal.sum()) + 1


def mixed_magnitudes(shape, seed: int) -> np.ndarray:
    """float32 normal values over 11 decades (from far below any FP8 range
    to a few thousand) and 2% exact zeros."""
    g = np.random.default_rng(seed)
    x = g.standard_normal(shape) * 10.0 ** g.uniform(-8, 3, shape)
    x[g.random(shape) < 0.02] = 0.0
    return x.astype(np.float32)
