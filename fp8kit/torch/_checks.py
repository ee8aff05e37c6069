"""Python-side argument checks: plain TypeErrors/ValueErrors that name the
function, the argument and the fix, for mistakes the C++ bindings would
otherwise report as a pybind11 signature mismatch."""

from __future__ import annotations

import torch

# HIGH_PRECISION (the nominal dtypes) is the quantized tensor's; the package
# also reads it as _checks.HIGH_PRECISION.
from fp8kit.torch.quantized_tensor import HIGH_PRECISION, QuantizedTensor

FP8_DTYPES = ("e4m3", "e5m2")
TORCH_FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
FP8_NAME = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}


def tensor(fn: str, arg: str, x, *, allow_none: bool = False):
    """x must be a plain torch.Tensor (not a quantized one)."""
    if x is None and allow_none:
        return
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn}: {arg} must be a torch.Tensor, got {type(x).__name__}")
    if isinstance(x, QuantizedTensor):
        raise TypeError(f"{fn}: {arg} is an fp8kit {type(x).__name__}; pass a plain tensor "
                        f"({arg}.dequantize()) or its FP8 buffers")


def fp8_name(fn: str, arg: str, name) -> str:
    if name not in FP8_DTYPES:
        raise ValueError(f"{fn}: {arg} is {name!r}; use 'e4m3' (float8_e4m3fn) or 'e5m2' "
                         "(float8_e5m2)")
    return name


def dtype(fn: str, arg: str, d) -> torch.dtype:
    if not isinstance(d, torch.dtype):
        raise TypeError(f"{fn}: {arg} must be a torch.dtype (e.g. torch.bfloat16), got {d!r}")
    return d


def fp8_copies(fn: str, data, columnwise_data) -> torch.Tensor:
    """The FP8 copies a quantized tensor is made of: at least one given,
    each a plain contiguous FP8 tensor, both of one dtype and device.
    Returns the copy that gives the tensor's format and device (data if
    given)."""
    if data is None and columnwise_data is None:
        raise ValueError(f"{fn}: data and columnwise_data are both None; pass at least one")
    ref = data if data is not None else columnwise_data
    for name, t in (("data", data), ("columnwise_data", columnwise_data)):
        if t is None:
            continue
        tensor(fn, name, t)
        if t.dtype not in FP8_NAME:
            raise TypeError(f"{fn}: {name} has dtype {t.dtype}; expected torch.float8_e4m3fn "
                            "or torch.float8_e5m2")
        if t.dtype != ref.dtype:
            raise TypeError(f"{fn}: data is {data.dtype} but columnwise_data is "
                            f"{columnwise_data.dtype}; both copies hold one FP8 format")
        if t.device != ref.device:
            raise ValueError(f"{fn}: data is on {data.device} but columnwise_data is on "
                             f"{columnwise_data.device}; keep both on one device")
        if not t.is_contiguous():
            raise ValueError(f"{fn}: {name} is not contiguous (strides {t.stride()}); pass "
                             f"{name}.contiguous(): in-place ops and the FP8 GEMMs write "
                             "and read it densely")
    return ref


def quantized_shape(fn: str, dtype, shape, data, columnwise_data, columnwise_shape) -> tuple:
    """A quantized tensor's nominal dtype checked and its shape: `shape`, or
    the rowwise copy's (else the columnwise copy's, transposed), checked
    against both copies; columnwise_shape(shape) is the columnwise layout."""
    if dtype not in HIGH_PRECISION:
        raise TypeError(f"{fn}: dtype is {dtype}; the nominal dtype must be torch.float32, "
                        "torch.bfloat16 or torch.float16")
    if shape is None:
        shape = tuple(data.shape) if data is not None else (columnwise_data.shape[1],
                                                            columnwise_data.shape[0])
    shape = tuple(int(s) for s in shape)
    if data is not None and tuple(data.shape) != shape:
        raise ValueError(f"{fn}: shape {shape} differs from data's shape {tuple(data.shape)}")
    if columnwise_data is not None and tuple(columnwise_data.shape) != columnwise_shape(shape):
        raise ValueError(f"{fn}: columnwise_data has shape {tuple(columnwise_data.shape)} but "
                         f"a tensor of shape {shape} has the columnwise layout "
                         f"{columnwise_shape(shape)}")
    return shape
