"""Float8Tensor's quantization steps while torch.compile, torch.export or
FakeTensorMode traces it: the dispatcher ops torch.ops.fp8kit.* (which have
fake kernels and compute the same bits), where eager mode makes one
pybind11 call (which needs real data).

A Float8Tensor is traced when its buffers are not plain tensors (fake,
functional or proxy tensors) or while dynamo or export traces.
"""

from __future__ import annotations

import torch

from fp8kit.torch import _checks
from fp8kit.torch._ext import ext

_ops = torch.ops.fp8kit
_is_compiling = torch.compiler.is_compiling


def traced(buffer: torch.Tensor) -> bool:
    """Whether a Float8Tensor holding `buffer` is being traced."""
    return type(buffer) is not torch.Tensor or _is_compiling()


def dequantize(data, scale_inv, dtype, from_columnwise: bool, shape):
    """ext.dequantize(data, scale_inv, dtype, from_columnwise, shape) as a
    traced op."""
    return _ops.dequantize(data, scale_inv, dtype, from_columnwise, shape)


def requantize(dst, quantizer, src: torch.Tensor) -> None:
    """quantizer.update_quantized(src, dst) as traced ops: quantizes src
    (dst's shape and nominal dtype) into the copies the owning Float8Tensor
    dst holds and its scale_inv; `quantizer` None keeps dst's scale."""
    fp8 = _checks.TORCH_FP8[dst._fp8_dtype]
    if quantizer is not None and dst._fp8_dtype != quantizer.fp8_dtype:
        raise TypeError(f"fp8kit Quantizer.update_quantized: dst holds {dst._fp8_dtype} data but "
                        f"the quantizer makes {quantizer.fp8_dtype}")
    rowwise, columnwise = dst._data is not None, dst._columnwise_data is not None
    if isinstance(quantizer, ext.Float8CurrentScalingQuantizer):
        data, cw, _, scale_inv, _ = _ops.quantize_current_scaling(
            src, fp8, rowwise, columnwise, quantizer.amax_epsilon, quantizer.power_2_scale)
    else:
        scale = torch.reciprocal(dst._scale_inv) if quantizer is None else quantizer.scale
        data, cw, scale_inv, amax = _ops.quantize(src, scale, fp8, rowwise, columnwise)
        if quantizer is not None and quantizer.amax is not None:
            quantizer.amax.copy_(amax)
    if rowwise:
        dst._data.copy_(data)
    if columnwise:
        dst._columnwise_data.copy_(cw)
    dst._scale_inv.copy_(scale_inv.reshape(dst._scale_inv.shape))
