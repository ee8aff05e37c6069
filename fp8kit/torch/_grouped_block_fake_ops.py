"""Fake (meta) kernels of the block-scaled grouped dispatcher ops
(torch_ext/grouped_block_ops.cc): output shapes, dtypes and devices only.
Token-grouped tensors hold `rows` rows in the padded row layout
(fp8kit/grouped.h); a copy's block scales are flat, block_scales_floats
elements; the columnwise copy is flat [rows * features]; a copy not asked
for is an empty [0] tensor."""

from __future__ import annotations

import torch

from fp8kit.torch._ext import ext


def _ceil_div(a, b):
    return (a + b - 1) // b


def block_scales_floats(rows, groups, features, scaling_mode: str, columnwise: bool):
    """fp8kit_grouped_block_scales_floats for ints or SymInts (a bound on
    the block scales of groups of [p_g, features], the p_g multiples of 16
    summing to at most rows); tests/torch/test_torch_grouped_linear.py
    checks it against the core's."""
    blocks = (rows + (ext.BLOCK_LEN - 1) * groups) // ext.BLOCK_LEN
    feature_blocks = _ceil_div(features, ext.BLOCK_LEN)
    pad = ext.BLOCK_SCALE_INNER_MULTIPLE
    if scaling_mode == "block_1x128":
        return _ceil_div(features, pad) * pad * blocks if columnwise else feature_blocks * rows
    if columnwise:  # a group's scale rows padded to the inner multiple
        return feature_blocks * (blocks + (pad - 1) * groups)
    return _ceil_div(feature_blocks, pad) * pad * blocks


@torch.library.register_fake("fp8kit::grouped_check_sizes")
def _grouped_check_sizes(group_sizes, tokens):
    return group_sizes.new_empty(group_sizes.shape)


@torch.library.register_fake("fp8kit::grouped_quantize_block")
def _grouped_quantize_block(x, group_sizes, fp8_dtype, scaling_mode, rowwise, columnwise,
                            amax_epsilon=0.0, power_2_scale=True):
    rows, features = x.shape
    groups = group_sizes.shape[0]

    def scales(want, cw):
        n = block_scales_floats(rows, groups, features, scaling_mode, cw) if want else 0
        return x.new_empty((n,), dtype=torch.float32)
    data = x.new_empty((rows, features) if rowwise else (0,), dtype=fp8_dtype)
    cw = x.new_empty((rows * features,) if columnwise else (0,), dtype=fp8_dtype)
    return data, scales(rowwise, False), cw, scales(columnwise, True)


@torch.library.register_fake("fp8kit::grouped_gemm_block_tokens")
def _grouped_gemm_block_tokens(a, a_scales, b, b_scales, b_columnwise, b_columnwise_scales,
                               group_sizes, out_dtype):
    cols = b.shape[1] if b is not None else b_columnwise.shape[1]
    return a.new_empty((a.shape[0], cols), dtype=out_dtype)


@torch.library.register_fake("fp8kit::grouped_gemm_block_contract")
def _grouped_gemm_block_contract(a_columnwise, a_scales, b_columnwise, b_scales, group_sizes,
                                 rows, out_dtype):
    return a_columnwise.new_empty((group_sizes.shape[0], a_columnwise.shape[0] // rows,
                                   b_columnwise.shape[0] // rows), dtype=out_dtype)
