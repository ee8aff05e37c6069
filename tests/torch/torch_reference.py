"""Reference helpers for the fp8kit.torch tests: thin torch -> NumPy
wrappers around the shared NumPy/ml_dtypes reference (tests/fp8_reference.py,
independent of fp8kit, torch and jax), and the tests' device helpers.

Scale convention under test (common/include/fp8kit/tensor.h):
    q = saturate(round_to_nearest_even(x * scale)),  x ~= q * scale_inv,
saturate applying to finite x only (+-inf: NaN in E4M3, +-inf in E5M2).
"""

import numpy as np
import pytest
import torch

import fp8_reference as ref
# Re-exported for the tests here (column sums in the core's documented order).
from fp8_reference import CANONICAL_NAN, FP8_MAX, current_scale  # noqa: F401
from fp8_reference import column_sums as column_sums_f32  # noqa: F401

ML_DTYPE = ref.ML_FP8
TORCH_FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def to_numpy_f32(x: torch.Tensor) -> np.ndarray:
    return x.detach().cpu().float().numpy()


def ref_quantize_bits(x: torch.Tensor, scale: float, fmt: str) -> np.ndarray:
    """fp8_reference.quantize_bits of a torch tensor: uint8 FP8 bits of
    x * scale (float32 multiply, saturating finite values, canonical 0x7F
    NaN), the shape of x."""
    return ref.quantize_bits(to_numpy_f32(x), scale, fmt)


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


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def assert_bits_equal(got: torch.Tensor, want: torch.Tensor):
    """Same shape, dtype, device and bits (NaNs and signed zeros included)."""
    assert (got.shape, got.dtype, got.device) == (want.shape, want.dtype, want.device)
    as_int = _INT_OF_SIZE[got.element_size()]
    assert torch.equal(got.contiguous().view(as_int), want.contiguous().view(as_int))


def opcheck(op, args, kwargs=None):
    """torch.library.opcheck's default checks. Its test_schema detects
    mutation with torch.allclose, which has no FP8 kernel; for FP8 inputs
    that check is done here instead: every tensor argument keeps its bits
    (none of these ops' schemas declares a mutation)."""
    kwargs = kwargs or {}
    tensors = [t for t in list(args) + list(kwargs.values()) if isinstance(t, torch.Tensor)]
    if not any(t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) for t in tensors):
        torch.library.opcheck(op, args, kwargs)
        return
    assert not op._schema.is_mutable
    before = [t.clone() for t in tensors]
    torch.library.opcheck(op, args, kwargs, test_utils=(
        "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))
    op(*args, **kwargs)
    for t, b in zip(tensors, before):
        assert_bits_equal(t, b)
