"""fp8kit.torch.cast_statistics: what the cast of a tensor to FP8 lost,
read from the tensor and the FP8 copy the cast wrote (nothing is
re-quantized): its amax, how many values underflowed to zero or saturated
at the format's max, and the sums of squared error and of x^2
(fp8kit.statistics.CastStatistics says exactly what each is).

One pass on x's device, asynchronous on CUDA: the results stay tensors
there, so logging them every step costs no host synchronisation until they
are read. The work is the dispatcher op, called eagerly and under
torch.compile alike (fake kernel in fp8kit.torch._fake_ops):
    torch.ops.fp8kit.cast_statistics(x, data, scale_inv,
                                     scaling_mode="per_tensor",
                                     from_columnwise=False)
        -> (amax, underflow, saturated, error_sq, norm_sq)
where data is one stored FP8 copy of x (rowwise, or with from_columnwise
the [x.shape[-1], prod(x.shape[:-1])] one), scale_inv its float32[1]
scale_inv or, for scaling_mode "block_1x128" / "block_128x128", that
copy's block scales, or for "per_row" (a grouped copy's rows, each cast
with its expert's scale; the rowwise copy) one float32 scale_inv per row;
the counts are int64, the rest float32.
"""

from __future__ import annotations

import torch

from fp8kit.statistics import CastStatistics
from fp8kit.torch import _checks
from fp8kit.torch.float8_block_tensor import Float8BlockTensor
from fp8kit.torch.float8_tensor import Float8Tensor

_FN = "fp8kit.torch.cast_statistics"


def _copy_read(quantized, columnwise: bool):
    """(data, scales, scaling mode) of the copy of `quantized` to read."""
    if isinstance(quantized, Float8Tensor):
        data = quantized.columnwise_data if columnwise else quantized.rowwise_data
        return data, quantized.scale_inv, "per_tensor"
    if isinstance(quantized, Float8BlockTensor):
        if columnwise:
            data, scales = quantized.columnwise_data, quantized.columnwise_block_scale_inv
        else:
            data, scales = quantized.rowwise_data, quantized.block_scale_inv
        return data, scales, quantized.scaling_mode
    what = (f"a plain {quantized.dtype} tensor" if isinstance(quantized, torch.Tensor)
            else type(quantized).__name__)
    raise TypeError(f"{_FN}: quantized must be an fp8kit Float8Tensor or Float8BlockTensor (the "
                    f"FP8 copy of x that a quantizer made, e.g. "
                    f"fp8kit.torch.Float8CurrentScalingQuantizer()(x)), got {what}; wrap FP8 "
                    "data with its scale_inv as fp8kit.torch.Float8Tensor(data, scale_inv, "
                    "dtype=x.dtype)")


def cast_statistics(x: torch.Tensor, quantized, columnwise: bool = False) -> CastStatistics:
    """The statistics of the cast of x into `quantized`, its FP8 copy.

    x: the high-precision tensor (float32, bfloat16 or float16, any rank up
    to 8) that `quantized` was made from. quantized: a Float8Tensor (one
    scale_inv) or a Float8BlockTensor (a scale per 1x128 tile or 128x128
    block) of x's shape, on x's device. columnwise: read its columnwise
    copy (which must be held) instead of its rowwise one; the two may
    differ under block scaling, whose copies have their own blocks.

    Returns a CastStatistics of 0-d tensors on x's device (amax, error_sq,
    norm_sq float32; underflow, saturated int64), with relative_error,
    underflow_rate(numel) and saturation_rate(numel) derived on the device.
    Not differentiable (x is read detached). Fewer than 2**32 elements.
    """
    _checks.tensor(_FN, "x", x)
    if x.dtype not in _checks.HIGH_PRECISION:
        raise TypeError(f"{_FN}: x has dtype {x.dtype}; it is the high-precision tensor that "
                        "was cast (torch.float32, torch.bfloat16 or torch.float16)")
    if not isinstance(columnwise, bool):
        raise TypeError(f"{_FN}: columnwise={columnwise!r} must be True or False")
    data, scales, mode = _copy_read(quantized, columnwise)
    if tuple(quantized.shape) != tuple(x.shape):
        raise ValueError(f"{_FN}: x has shape {tuple(x.shape)} but quantized has shape "
                         f"{tuple(quantized.shape)}; pass the FP8 copy of x itself")
    if quantized.device != x.device:
        raise ValueError(f"{_FN}: x is on {x.device} but quantized is on {quantized.device}; "
                         "move one of them (x.to(quantized.device))")
    if data is None:
        which, held = ("columnwise", "rowwise") if columnwise else ("rowwise", "columnwise")
        raise ValueError(f"{_FN}: quantized holds no {which} copy; read its {held} one "
                         f"(columnwise={not columnwise}) or quantize x with a quantizer made with "
                         f"{which}=True")
    return CastStatistics(*torch.ops.fp8kit.cast_statistics(x.detach(), data, scales, mode,
                                                            columnwise))
