"""Fake (meta) kernels of the block-scaled dispatcher ops
(torch_ext/block_dispatcher_ops.cc, block_linear.cc), as _fake_ops has
those of the others:
each gives its op's output shapes, dtypes and devices without computing
anything, following the C++ kernels' rules (a copy not asked for is an
empty [0] tensor; block scales have the shape ext.block_scale_inv_shape
gives, computed here so that a symbolic token count stays symbolic:
tests/torch/test_torch_compile_dynamic.py checks the two agree)."""

from __future__ import annotations

import torch

from fp8kit.torch._ext import ext
from fp8kit.torch._fake_ops import columnwise_shape, dequantized, gemm_output


def _blocks(n):
    return (n + ext.BLOCK_LEN - 1) // ext.BLOCK_LEN


def block_scale_inv_shape(shape, scaling_mode: str, columnwise: bool) -> tuple:
    """(outer, inner) of the scales of a copy of a tensor of `shape` (ints
    or SymInts), as fp8kit_block_scale_inv_shape lays them out: a 1x128
    copy [rows, cols] has a scale per row for each 128 columns, a 128x128
    one per block; inner is padded to a multiple of 4. The columnwise copy
    is stored [cols, rows]."""
    cols, rows = columnwise_shape(shape)
    if columnwise:
        rows, cols = cols, rows
    if scaling_mode == "block_1x128":
        outer, inner = _blocks(cols), rows
    elif scaling_mode == "block_128x128":
        outer, inner = _blocks(rows), _blocks(cols)
    else:
        raise ValueError(f"fp8kit::quantize_block: scaling_mode is {scaling_mode!r}; use "
                         "'block_1x128' (activations and gradients) or 'block_128x128' "
                         "(weights)")
    pad = ext.BLOCK_SCALE_INNER_MULTIPLE
    return outer, (inner + pad - 1) // pad * pad


@torch.library.register_fake("fp8kit::quantize_block")
def _quantize_block(x, fp8_dtype, scaling_mode, rowwise, columnwise, amax_epsilon=0.0,
                    power_2_scale=True):
    def copy(wanted, data_shape, cw):
        if not wanted:
            return x.new_empty((0,), dtype=fp8_dtype), x.new_empty((0,), dtype=torch.float32)
        scales = block_scale_inv_shape(x.shape, scaling_mode, cw)
        return (x.new_empty(data_shape, dtype=fp8_dtype),
                x.new_empty(scales, dtype=torch.float32))

    data, sinv = copy(rowwise, x.shape, False)
    cw, cw_sinv = copy(columnwise, columnwise_shape(x.shape), True)
    return data, sinv, cw, cw_sinv


@torch.library.register_fake("fp8kit::dequantize_block")
def _dequantize_block(data, block_scale_inv, scaling_mode, out_dtype, from_columnwise=False,
                      shape=None):
    return dequantized(data, out_dtype, from_columnwise, shape)


@torch.library.register_fake("fp8kit::gemm_block")
def _gemm_block(a, a_block_scale_inv, a_columnwise, a_columnwise_block_scale_inv, a_scaling_mode,
                b, b_block_scale_inv, b_columnwise, b_columnwise_block_scale_inv, b_scaling_mode,
                trans_a, trans_b, out_dtype, bias=None):
    return gemm_output(a, a_columnwise, b, b_columnwise, trans_a, trans_b, out_dtype)


def _gemm_rows(m, min_rows: int):
    """torch_ext/block_linear.cc's gemm_rows for an int or a SymInt count,
    without a guard on a symbolic one (torch.sym_max)."""
    mult = ext.GEMM_DIM_MULTIPLE
    rows = (m + mult - 1) // mult * mult
    if not min_rows:
        return rows
    if isinstance(rows, torch.SymInt):
        return torch.sym_max(rows, min_rows)
    return max(rows, min_rows)


def _kept_copy(like, kept: bool, shape, fp8_dtype, scaling_mode: str):
    """A columnwise copy of a tensor of `shape` and its block scales, or the
    empty stand-ins."""
    if not kept:
        return like.new_empty((0,), dtype=fp8_dtype), like.new_empty((0,), dtype=torch.float32)
    return (like.new_empty(columnwise_shape(shape), dtype=fp8_dtype),
            like.new_empty(block_scale_inv_shape(shape, scaling_mode, True),
                           dtype=torch.float32))


@torch.library.register_fake("fp8kit::block_linear_forward")
def _block_linear_forward(x, weight, bias, forward_dtype, amax_epsilon, power_2_scale, dgrad,
                          wgrad, min_rows, statistics=None):
    rows = _gemm_rows(x.shape[0], min_rows)
    x_cw = _kept_copy(x, wgrad, (rows, x.shape[1]), forward_dtype, "block_1x128")
    w_cw = _kept_copy(x, dgrad, weight.shape, forward_dtype, "block_128x128")
    return (x.new_empty((x.shape[0], weight.shape[0])), *x_cw, *w_cw)


@torch.library.register_fake("fp8kit::block_linear_backward")
def _block_linear_backward(grad_output, x_columnwise, x_columnwise_scale_inv, w_columnwise,
                           w_columnwise_scale_inv, backward_dtype, amax_epsilon, power_2_scale,
                           in_features, dgrad, wgrad, bgrad, min_rows, statistics=None):
    m, n = grad_output.shape
    grad = (lambda wanted, shape: grad_output.new_empty(shape if wanted else (0,)))
    return grad(dgrad, (m, in_features)), grad(wgrad, (n, in_features)), grad(bgrad, (n,))
