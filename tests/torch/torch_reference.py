"""Reference math for the fp8kit.torch tests, independent of fp8kit: NumPy
in float32/float64 and ml_dtypes' FP8 conversions.

Scale convention under test (common/include/fp8kit/tensor.h):
    q = saturate(round_to_nearest_even(x * scale)),  x ~= q * scale_inv,
saturate applying to finite x only (+-inf: NaN in E4M3, +-inf in E5M2).
"""

import ml_dtypes
import numpy as np
import pytest
import torch

ML_DTYPE = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
FP8_MAX = {k: float(ml_dtypes.finfo(v).max) for k, v in ML_DTYPE.items()}
TORCH_FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
CANONICAL_NAN = 0x7F  # the core's documented NaN encoding (both formats)


def to_numpy_f32(x: torch.Tensor) -> np.ndarray:
    return x.detach().cpu().float().numpy()


def ref_quantize_bits(x: torch.Tensor, scale: float, fmt: str) -> np.ndarray:
    """uint8 bits of ml_dtypes' conversion of x * scale (float32 multiply),
    clipped to +-fp8_max where x is finite (a product past FLT_MAX
    included); an infinite x stays inf (E5M2) or becomes NaN (E4M3); NaN
    lanes get the canonical 0x7F."""
    x32 = to_numpy_f32(x)
    with np.errstate(over="ignore", invalid="ignore"):
        xs = x32.reshape(-1) * np.float32(scale)
        m = np.float32(FP8_MAX[fmt])
        clipped = np.where(np.isinf(x32.reshape(-1)), xs, np.clip(xs, -m, m))
    bits = clipped.astype(ML_DTYPE[fmt]).view(np.uint8).copy()
    bits[np.isnan(clipped) | (np.isinf(clipped) & (fmt == "e4m3"))] = CANONICAL_NAN
    return bits.reshape(x32.shape)


def fp8_bits(q: torch.Tensor) -> np.ndarray:
    return q.detach().cpu().view(torch.uint8).numpy()


def decode(q: torch.Tensor) -> np.ndarray:
    """FP8 tensor -> float64 values via ml_dtypes."""
    fmt = "e4m3" if q.dtype == torch.float8_e4m3fn else "e5m2"
    return fp8_bits(q).view(ML_DTYPE[fmt]).astype(np.float64)


def assert_fp8_equal_reference(q: torch.Tensor, x: torch.Tensor, scale: float, fmt: str):
    """Bit-exact check; on failure reports the first mismatching lanes."""
    got = fp8_bits(q).reshape(-1)
    want = ref_quantize_bits(x, scale, fmt).reshape(-1)
    bad = np.nonzero(got != want)[0]
    if bad.size:
        xs = to_numpy_f32(x).reshape(-1)
        lanes = ", ".join(f"x={xs[i]!r} got=0x{got[i]:02x} want=0x{want[i]:02x}"
                          for i in bad[:8])
        raise AssertionError(f"{bad.size} of {got.size} lanes differ ({fmt}, scale={scale}): "
                             f"{lanes}")


def current_scale(amax: float, fmt: str, epsilon: float = 0.0, pow2: bool = False) -> np.float32:
    """The current-scaling rule in float32: fp8_max / max(amax, eps), 1 for a
    zero or non-finite amax, optionally rounded down to a power of two."""
    a = np.float32(amax)
    if not np.isfinite(a) or not a > 0:
        return np.float32(1.0)
    d = max(a, np.float32(epsilon))
    s = np.float32(FP8_MAX[fmt]) / d
    if not np.isfinite(s):
        s = np.float32(np.finfo(np.float32).max)
    if pow2:
        s = np.float32(2.0 ** np.floor(np.log2(np.float64(s))))
        if FP8_MAX[fmt] / np.float64(s) > np.finfo(np.float32).max:  # fp8_max * scale_inv
            s = np.float32(2 * s)                                     # must stay finite
    return np.float32(s)


def column_sums_f32(a: np.ndarray) -> np.ndarray:
    """Column sums of a 2-D array in the core's documented float32 order
    (fp8kit_column_sums): rows cut into tiles of 128 and tiles into groups
    of 8; a group sum adds its rows in order to 0, a tile sum its 16 group
    sums in order to 0, and each column sum the tile sums in order to 0."""
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


def all_bf16() -> torch.Tensor:
    """Every one of the 65,536 bfloat16 bit patterns."""
    return torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def random_f32(n: int, seed: int) -> torch.Tensor:
    """float32 values spread over many binades (both signs, denormals,
    values far beyond the FP8 range)."""
    g = torch.Generator().manual_seed(seed)
    mant = torch.rand(n, generator=g) + 0.5
    exp = torch.randint(-140, 30, (n,), generator=g).float()
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    return (sign * mant * torch.pow(2.0, exp)).float()


# The devices a test runs on: the CUDA case is a GPU test (pytest -m gpu).
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def cuda_or_skip() -> torch.device:
    """The CUDA device, or skip (no GPU, or an fp8kit build without CUDA)."""
    import fp8kit.torch as ft
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    if not ft.built_with_cuda():
        pytest.skip("fp8kit was built without CUDA")
    return torch.device("cuda", torch.cuda.current_device())


def device_of(name: str) -> torch.device:
    """The torch device for a DEVICES name, skipping where CUDA is missing."""
    return cuda_or_skip() if name == "cuda" else torch.device("cpu")


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def assert_bits_equal(got: torch.Tensor, want: torch.Tensor):
    """Same shape, dtype, device and bits (NaNs and signed zeros included)."""
    assert (got.shape, got.dtype, got.device) == (want.shape, want.dtype, want.device)
    as_int = _INT_OF_SIZE[got.element_size()]
    assert torch.equal(got.contiguous().view(as_int), want.contiguous().view(as_int))
