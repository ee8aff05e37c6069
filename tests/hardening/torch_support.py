"""What the torch property modules share: device selection, building a
tensor of a drawn layout, reading results back."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fp8_reference as ref

torch.set_num_threads(1)  # small tensors; 2-core CI machines

HP = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def device_or_skip(device: str) -> torch.device:
    if device == "cuda":
        import fp8kit.torch as ft
        if not torch.cuda.is_available():
            pytest.skip("no CUDA GPU")
        if not ft.built_with_cuda():
            pytest.skip("fp8kit was built without CUDA")
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(device)


def laid_out_tensor(src: np.ndarray, layout: str, shape, dtype: str, device) -> torch.Tensor:
    """The logical tensor of `shape` in `layout` (see fp8_strategies.laid_out)."""
    t = torch.from_numpy(np.array(src, order="C")).to(HP[dtype]).to(device)
    shape = tuple(shape)
    if layout == "transposed" and len(shape) >= 2:
        t = t.transpose(-1, -2)
    elif layout == "strided" and shape:
        t = t[..., ::2]
    elif layout == "expanded" and shape:
        t = t.expand(shape)
    assert tuple(t.shape) == shape
    return t


def values(t: torch.Tensor) -> np.ndarray:
    """A high-precision tensor's values as float32 NumPy (the reference's input)."""
    return t.detach().cpu().float().numpy()


def bits(q: torch.Tensor) -> np.ndarray:
    return q.detach().cpu().contiguous().view(torch.uint8).numpy()


def fp8_tensor(b: np.ndarray, fmt: str, device) -> torch.Tensor:
    return torch.from_numpy(np.array(b, np.uint8, order="C")).to(device).view(FP8[fmt])


def scalar(t: torch.Tensor) -> np.float32:
    assert t.numel() == 1, f"expected one element, got shape {tuple(t.shape)}"
    return np.float32(t.detach().cpu().reshape(()).item())


def check_quantized(data, columnwise_data, x: np.ndarray, scale, fmt: str, rowwise: bool,
                    columnwise: bool, what: str):
    """data / columnwise_data hold x quantized with `scale`, as asked."""
    want = ref.quantize_bits(x, scale, fmt)
    if rowwise:
        assert data is not None, f"{what}: rowwise data missing"
        assert data.dtype == FP8[fmt] and tuple(data.shape) == x.shape, (
            f"{what}: data is {data.dtype} {tuple(data.shape)}, expected {FP8[fmt]} {x.shape}")
        ref.assert_bits_equal(bits(data), want, f"{what} rowwise", x)
    else:
        assert data is None, f"{what}: rowwise data returned though not asked for"
    if columnwise:
        assert columnwise_data is not None, f"{what}: columnwise data missing"
        assert tuple(columnwise_data.shape) == ref.columnwise_shape(x.shape), (
            f"{what}: columnwise shape {tuple(columnwise_data.shape)}, expected "
            f"{ref.columnwise_shape(x.shape)}")
        ref.assert_bits_equal(bits(columnwise_data), ref.columnwise_bits(want),
                              f"{what} columnwise")
    else:
        assert columnwise_data is None, f"{what}: columnwise data returned though not asked for"
