"""fp8kit.torch.amax against NumPy on CPU (and CUDA against CPU on a GPU)."""

import numpy as np
import pytest
import torch

import fp8kit.torch as ft
from torch_reference import cuda_or_skip, to_numpy_f32

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SHAPES = [(), (1,), (7,), (3, 5), (2, 3, 17), (4, 1, 2, 33), (1000, 3)]


def np_amax(x: torch.Tensor) -> np.float32:
    a = to_numpy_f32(x)
    return np.float32(np.max(np.abs(a))) if a.size else np.float32(0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_numpy(dtype, shape):
    g = torch.Generator().manual_seed(len(shape) * 31 + DTYPES.index(dtype))
    x = (torch.randn(shape, generator=g) * 3).to(dtype)
    got = ft.amax(x)
    assert got.dtype == torch.float32 and got.shape == () and got.device == x.device
    assert np.float32(got.item()) == np_amax(x)  # exact: a max of exactly converted values


def test_special_values():
    assert torch.isposinf(ft.amax(torch.tensor([1.0, -2.0, float("inf"), 0.5])))
    assert torch.isposinf(ft.amax(torch.tensor([1.0, float("-inf")], dtype=torch.bfloat16)))
    assert torch.isnan(ft.amax(torch.tensor([1.0, float("nan"), float("-inf")])))
    assert ft.amax(torch.tensor([-0.0, 0.0], dtype=torch.bfloat16)).item() == 0.0
    tiny = torch.tensor([1e-40, -3e-41], dtype=torch.float32)  # float32 denormals
    assert ft.amax(tiny).item() == torch.tensor(1e-40).item()
    assert ft.amax(torch.tensor([-65504.0, 3.0], dtype=torch.float16)).item() == 65504.0


def test_empty_is_zero():
    assert ft.amax(torch.zeros(0, 4)).item() == 0.0
    assert ft.amax(torch.zeros(3, 0, dtype=torch.bfloat16)).item() == 0.0


def test_non_contiguous_input_is_handled():
    x = torch.randn(64, 48)
    xt = x.t()[::2]
    assert not xt.is_contiguous()
    assert ft.amax(xt).item() == np_amax(xt.contiguous())


def test_result_does_not_track_gradients():
    x = torch.randn(8, requires_grad=True)
    assert not ft.amax(x).requires_grad


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float64, torch.bool,
                                   torch.uint8, torch.float8_e4m3fn, torch.complex64])
def test_unsupported_dtype_raises_type_error(dtype):
    x = torch.zeros(4, dtype=dtype)
    with pytest.raises(TypeError, match=r"fp8kit.torch.amax: x has dtype .*expected "
                                        r"torch.float32, torch.bfloat16 or torch.float16"):
        ft.amax(x)


def test_not_a_tensor_raises_type_error():
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        ft.amax([1.0, 2.0])
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got ndarray"):
        ft.amax(np.ones(3, np.float32))


def test_low_level_binding_matches():
    x = torch.randn(5, 7, dtype=torch.bfloat16)
    assert ft.ops.ext.amax(x).item() == ft.amax(x).item()
    with pytest.raises(TypeError, match="x has dtype torch.float64"):
        ft.ops.ext.amax(x.double())


def test_meta_device_raises_value_error():
    with pytest.raises((ValueError, TypeError), match="fp8kit.torch.amax"):
        ft.amax(torch.zeros(3, device="meta"))


# ------------------------------------------------------------------ CUDA ----
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES + [(4097, 33), (3, 1 << 20)])
def test_cuda_matches_cpu(dtype, shape):
    dev = cuda_or_skip()
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(shape, generator=g) * 5).to(dtype)
    got = ft.amax(x.to(dev))
    assert got.device == dev and got.shape == ()
    assert got.item() == ft.amax(x).item() == np_amax(x)


@pytest.mark.gpu
def test_cuda_special_values_and_stream():
    dev = cuda_or_skip()
    x = torch.tensor([1.0, float("nan"), 3.0], device=dev)
    assert torch.isnan(ft.amax(x)).item()
    assert ft.amax(torch.zeros(0, device=dev)).item() == 0.0
    s = torch.cuda.Stream()
    y = torch.randn(1 << 22, device=dev)
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # work goes to the current stream
        got = ft.amax(y)
    torch.cuda.current_stream().wait_stream(s)
    assert got.item() == y.abs().max().item()
