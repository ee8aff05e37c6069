"""Fake (meta) kernels of the grouped dispatcher ops
(torch_ext/grouped_ops.cc), as _fake_ops has those of the others: output
shapes, dtypes and devices only, by the C++ kernels' rules (the state
grouped_quantize_delayed returns is shaped as the one it takes). Per-group
scales are float32 [E, GROUP_SCALE_STRIDE]; the grouped columnwise copy of
[T, F] is flat, F * columnwise_tokens(T, E) elements; a copy not asked for
is an empty [0] tensor."""

from __future__ import annotations

import torch

from fp8kit.torch._ext import ext


def columnwise_tokens(tokens, groups):
    """fp8kit_grouped_columnwise_tokens (fp8kit/grouped.h) for ints or
    SymInts: the most columns the groups' blocks, each padded to
    GEMM_DIM_MULTIPLE tokens, can take."""
    return tokens + (ext.GEMM_DIM_MULTIPLE - 1) * groups


def _scales(like: torch.Tensor, groups):
    return like.new_empty((groups, ext.GROUP_SCALE_STRIDE), dtype=torch.float32)


@torch.library.register_fake("fp8kit::grouped_quantize")
def _grouped_quantize(x, group_sizes, fp8_dtype, rowwise, columnwise, scale=None,
                      amax_epsilon=0.0, power_2_scale=False):
    tokens, features = x.shape
    groups = group_sizes.shape[0]
    data = x.new_empty((tokens, features) if rowwise else (0,), dtype=fp8_dtype)
    cw = x.new_empty((features * columnwise_tokens(tokens, groups),) if columnwise else (0,),
                     dtype=fp8_dtype)
    return data, cw, _scales(x, groups), _scales(x, groups), _scales(x, groups)


@torch.library.register_fake("fp8kit::grouped_quantize_delayed")
def _grouped_quantize_delayed(x, group_sizes, fp8_dtype, rowwise, columnwise, amax_history,
                              scale, seeded, margin, amax_reduction, record):
    data, cw, _, scale_inv, _ = _grouped_quantize(x, group_sizes, fp8_dtype, rowwise,
                                                  columnwise)
    return (data, cw, scale_inv, torch.empty_like(amax_history), torch.empty_like(scale),
            torch.empty_like(seeded))


@torch.library.register_fake("fp8kit::grouped_gemm_tokens")
def _grouped_gemm_tokens(a, a_scale_inv, b, b_columnwise, b_scale_inv, group_sizes, trans_b,
                         out_dtype, bias=None, use_split_accumulator=True):
    if b is not None:
        rows, cols = b.shape[1], b.shape[2]
    else:
        rows, cols = b_columnwise.shape[2], b_columnwise.shape[1]
    return a.new_empty((a.shape[0], rows if trans_b else cols), dtype=out_dtype)


@torch.library.register_fake("fp8kit::grouped_gemm_contract")
def _grouped_gemm_contract(a_columnwise, a_scale_inv, b_columnwise, b_scale_inv, group_sizes,
                           tokens, out_dtype, use_split_accumulator=True):
    groups = group_sizes.shape[0]
    capacity = columnwise_tokens(tokens, groups)
    return a_columnwise.new_empty(
        (groups, a_columnwise.shape[0] // capacity, b_columnwise.shape[0] // capacity),
        dtype=out_dtype)
