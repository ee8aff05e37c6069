"""fp8kit.torch's block-scaled functional API: thin checked wrappers over
the C++ bindings in fp8kit._torch_ext (one call each into the core's C API).

Block scaling (common/include/fp8kit/block_scaling.h): one float32 scale per
1x128 tile ("block_1x128": activations and gradients) or per 128x128 block
("block_128x128": weights) of each stored copy, from that block's own amax:
    scale = fp8_max / max(amax, amax_epsilon)   (1 for a block of zeros or
            one holding a NaN or inf; rounded down to a power of two with
            power_2_scale, but never below fp8_max / FLT_MAX, so that no
            finite value dequantizes to inf)
    q = saturate(round_to_nearest_even(x * scale)),  x ~= q * scale_inv,
    saturating finite values only (an inf or NaN stays non-finite).
A copy's scales are a float32 [outer, inner] tensor in the layout cuBLASLt
reads on Hopper (block_scale_inv_shape). The rowwise copy has the tensor's
shape; the columnwise copy is its [shape[-1], prod(shape[:-1])] transpose,
blocked along its own rows, so its scales are its own.

The same kernels are dispatcher ops too, what torch.compile traces (fake
kernels in fp8kit.torch._block_fake_ops):
    quantize_block(x, fp8_dtype, scaling_mode, rowwise, columnwise,
                   amax_epsilon=0., power_2_scale=True)
        -> (data, block_scale_inv, columnwise_data, columnwise_block_scale_inv)
    dequantize_block(data, block_scale_inv, scaling_mode, out_dtype,
                     from_columnwise=False, shape=None) -> Tensor
    gemm_block(a, a_block_scale_inv, a_columnwise, a_columnwise_block_scale_inv,
               a_scaling_mode, b, ..., b_scaling_mode, trans_a, trans_b,
               out_dtype, bias=None) -> Tensor
where fp8_dtype is a torch dtype, a copy not asked for is an empty [0]
tensor instead of None, and gemm_block has no accumulate or out.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from fp8kit.torch import _checks
from fp8kit.torch._ext import ext


def block_scale_inv_shape(shape: Sequence[int], scaling_mode: str,
                          columnwise: bool = False) -> tuple:
    """(outer, inner) of the scales of the rowwise (or columnwise) copy of a
    tensor of `shape` quantized with `scaling_mode`."""
    return ext.block_scale_inv_shape([int(s) for s in shape], scaling_mode, bool(columnwise))


def quantize_block(x: torch.Tensor, fp8_dtype: str = "e4m3", scaling_mode: str = "block_1x128",
                   rowwise: bool = True, columnwise: bool = False, amax_epsilon: float = 0.0,
                   power_2_scale: bool = True):
    """Block-scaled quantization of x (float32, bfloat16 or float16), both
    copies in one pass. Returns (data, block_scale_inv, columnwise_data,
    columnwise_block_scale_inv), None for a copy not asked for."""
    fn = "fp8kit.torch.quantize_block"
    _checks.tensor(fn, "x", x)
    _checks.fp8_name(fn, "fp8_dtype", fp8_dtype)
    return ext.quantize_block(x, fp8_dtype, scaling_mode, bool(rowwise), bool(columnwise),
                              float(amax_epsilon), bool(power_2_scale))


def dequantize_block(data: torch.Tensor, block_scale_inv: torch.Tensor, scaling_mode: str,
                     out_dtype: torch.dtype = torch.float32, from_columnwise: bool = False,
                     shape: Optional[Sequence[int]] = None) -> torch.Tensor:
    """Each element of one stored copy times its block's scale_inv, in
    out_dtype. With from_columnwise=True, data is the columnwise copy and the
    result has `shape` (default: the 2-D transpose of data)."""
    fn = "fp8kit.torch.dequantize_block"
    _checks.tensor(fn, "data", data)
    _checks.tensor(fn, "block_scale_inv", block_scale_inv)
    _checks.dtype(fn, "out_dtype", out_dtype)
    return ext.dequantize_block(data, block_scale_inv, scaling_mode, out_dtype,
                                bool(from_columnwise),
                                None if shape is None else [int(s) for s in shape])


def gemm_block(a, a_block_scale_inv, a_columnwise, a_columnwise_block_scale_inv, a_scaling_mode,
               b, b_block_scale_inv, b_columnwise, b_columnwise_block_scale_inv, b_scaling_mode,
               trans_a: bool = False, trans_b: bool = False,
               out_dtype: torch.dtype = torch.bfloat16, bias=None, accumulate: bool = False,
               out=None):
    """D = op(a) @ op(b), every element dequantized with its block's
    scale_inv (+ bias, bfloat16) (+ out's old contents with accumulate).

    Each operand: its rowwise copy and/or its columnwise copy, each with its
    block scales (None for a copy not held), and its scaling mode; not both
    "block_128x128". The core reads each operand's K-contiguous copy
    (forward x @ w^T: x and w rowwise; dgrad dy @ w: w columnwise; wgrad
    dy^T @ x: dy and x columnwise). out_dtype: torch.bfloat16 or
    torch.float32. Runs where supports_block_scaled_fp8_gemm(device) is True
    (Hopper with cuBLASLt 12.9+, and the CPU reference); elsewhere
    NotImplementedError.
    """
    fn = "fp8kit.torch.gemm_block"
    for name, v in (("a", a), ("a_block_scale_inv", a_block_scale_inv),
                    ("a_columnwise", a_columnwise),
                    ("a_columnwise_block_scale_inv", a_columnwise_block_scale_inv), ("b", b),
                    ("b_block_scale_inv", b_block_scale_inv), ("b_columnwise", b_columnwise),
                    ("b_columnwise_block_scale_inv", b_columnwise_block_scale_inv),
                    ("bias", bias), ("out", out)):
        _checks.tensor(fn, name, v, allow_none=True)
    _checks.dtype(fn, "out_dtype", out_dtype)
    return ext.gemm_block(a, a_block_scale_inv, a_columnwise, a_columnwise_block_scale_inv,
                          a_scaling_mode, b, b_block_scale_inv, b_columnwise,
                          b_columnwise_block_scale_inv, b_scaling_mode, bool(trans_a),
                          bool(trans_b), out_dtype, bias, bool(accumulate), out)


def supports_block_scaled_fp8_gemm(device) -> bool:
    """Whether `device` runs block-scaled FP8 GEMMs (the core's cached
    per-device answer: Hopper with cuBLASLt 12.9+, and the CPU reference)."""
    return ext.supports_block_scaled_fp8_gemm(torch.device(device))
