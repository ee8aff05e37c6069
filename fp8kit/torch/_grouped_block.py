"""GroupedLinear under fp8kit.recipe.BlockScaling: 1x128 tiles for the
tokens and the output gradient, 128x128 blocks for each expert's weight,
every scale its own block's.

Block-scaled GEMMs read the token dimension in multiples of 16, so the
grouped tensors are in the core's padded row layout (fp8kit/grouped.h):
each expert's tokens at a row offset that is a multiple of 16, zero rows
between. The layer gathers x into that layout and y back out (and dy in,
dx out in backward), with device-side indices: no host read. Into the
layout it gathers each padded row's token and then zeroes the padding
rows, which on the H200 moved a [16384, 14336] bfloat16 tensor in 0.25 ms
(plus a fill of the 15 padding rows per expert) against 0.82 ms for a
zero fill and an index_copy_.
Each expert's rows then quantize and multiply as a tensor of their own,
exactly as fp8kit.torch.Linear under BlockScaling pads and runs one
expert's tokens, so the two give the same bits (the bias apart: Linear
fuses it into its GEMM, this layer adds it after). Backward keeps x's and
w's columnwise FP8 copies only.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from fp8kit.torch import _checks
from fp8kit.torch import _grouped_statistics as grouped_statistics
from fp8kit.torch._ext import ext

_ops = torch.ops.fp8kit
ROW, BLOCK = "block_1x128", "block_128x128"


def sizes_on(sizes: torch.Tensor, device) -> torch.Tensor:
    """The counts on `device` without a wait: a plain .to() of a CPU tensor
    to a GPU waits for the stream (PyTorch synchronizes after a blocking
    host-to-device copy), which left the GPU idle behind every such call;
    from pinned memory the copy is queued like a kernel. Under
    torch.compile the compiler places the copy."""
    device = torch.device(device)
    if (sizes.device.type != "cpu" or device.type != "cuda"
            or torch.compiler.is_compiling()):
        return sizes.to(device)
    return sizes.pin_memory().to(device, non_blocking=True)


def token_experts(sizes: torch.Tensor, tokens, device) -> torch.Tensor:
    """Each token's expert index, [tokens] on `device`, with no host read."""
    sizes = sizes_on(sizes, device)
    experts = torch.arange(sizes.shape[0], device=sizes.device)
    return torch.repeat_interleave(experts, sizes, output_size=tokens)


def bias_grad(dy: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """Each expert's sum of its rows of dy [T, N], float32 [E, N] (zero for
    an expert with none). A segment reduction over the contiguous layout:
    each sum is taken in one thread's order, so the result is the same bits
    on every run, which an index_add_ (float atomics on CUDA) is not.
    unsafe=True leaves out segment_reduce's own checks of the counts (the
    forward checked them), which read them back to the host and so waited
    for the GPU on every call."""
    return torch.segment_reduce(dy.float(), "sum", lengths=sizes_on(sizes, dy.device), axis=0,
                                unsafe=True)


def padded_rows(sizes: torch.Tensor, tokens, device) -> torch.Tensor:
    """Each token's row in the padded row layout: its own row shifted by
    the padding of the experts before its own."""
    m = sizes_on(sizes, device)
    pad = (m + ext.GEMM_DIM_MULTIPLE - 1) // ext.GEMM_DIM_MULTIPLE * ext.GEMM_DIM_MULTIPLE - m
    shift = torch.cumsum(pad, 0) - pad
    return torch.arange(tokens, device=device) + shift[token_experts(m, tokens, device)]


class _Layout(NamedTuple):
    """Where a call's tokens lie in the padded row layout."""
    rows: int              # the layout's rows: room for every expert's padding
    rows_of: torch.Tensor  # [tokens] each token's row
    source: torch.Tensor   # [rows] each row's token (any token for a padding row)
    padding: torch.Tensor  # [rows - tokens] the padding rows


def padded_layout(sizes: torch.Tensor, tokens: int, device) -> _Layout:
    rows = tokens + (ext.GEMM_DIM_MULTIPLE - 1) * sizes.shape[0]
    rows_of = padded_rows(sizes, tokens, device)
    source = torch.zeros(rows, dtype=torch.int64, device=device).index_copy_(
        0, rows_of, torch.arange(tokens, device=device))
    is_padding = torch.ones(rows, dtype=torch.int32, device=device).index_fill_(0, rows_of, 0)
    # Exactly rows - tokens rows are padding: a stable descending sort puts
    # them first, so their indices come without a host read of a count.
    padding = torch.argsort(is_padding, descending=True, stable=True)[:rows - tokens]
    return _Layout(rows, rows_of, source, padding)


def to_padded(t: torch.Tensor, layout: _Layout) -> torch.Tensor:
    """t [tokens, k] in the padded row layout [rows, k], padding rows zero."""
    if t.shape[0] == 0:
        return t.new_zeros((layout.rows, t.shape[1]))
    return t.index_select(0, layout.source).index_fill_(0, layout.padding, 0)


def _gemm_dtype(dtype: torch.dtype) -> torch.dtype:
    """Block-scaled GEMMs write bfloat16 or float32; a float16 layer
    computes in float32 and rounds once."""
    return torch.bfloat16 if dtype == torch.bfloat16 else torch.float32


def grouped_block_linear(recipe, x, weight, bias, sizes, stats=None) -> torch.Tensor:
    """y [T, N] = each expert's tokens of x [T, K] @ its weight^T (+ bias);
    stats: the inspection rows the casts fill at a logged step, or None.
    Counts on the GPU are checked against T first (the layer checked those
    on the host): padding wrong counts would read and write out of range."""
    if sizes.device.type != "cpu":
        sizes = _ops.grouped_check_sizes(sizes, x.shape[0])
    grad = torch.is_grad_enabled()
    dgrad, wgrad = grad and x.requires_grad, grad and weight.requires_grad
    fmt = recipe.fp8_format
    cfg = (_checks.TORCH_FP8[fmt.forward_dtype], _checks.TORCH_FP8[fmt.backward_dtype],
           float(recipe.amax_epsilon), bool(recipe.power_2_scale), dgrad, wgrad)
    if dgrad or wgrad or (grad and bias is not None and bias.requires_grad):
        return _GroupedBlockFunction.apply(x, weight, bias, sizes, cfg, stats)
    return _forward(None, x, weight, bias, sizes, cfg, stats)


class _GroupedBlockFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, weight, bias, sizes, cfg, stats):
        return _forward(ctx, x, weight, bias, sizes, cfg, stats)

    @staticmethod
    def backward(ctx, dy):
        x_cw, x_cws, w_cw, w_cws, sizes, *indices = ctx.saved_tensors
        layout = _Layout(ctx.rows, *indices)
        _, bwd, eps, pow2, dgrad, wgrad = ctx.cfg
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dgrad, wgrad = dgrad and need_x, wgrad and need_w
        dx = dw = db = None
        gemm_dtype = _gemm_dtype(dy.dtype)
        if dgrad or wgrad:
            dy_p = to_padded(dy.contiguous(), layout)
            dy_d, dy_s, dy_cw, dy_cws = _quantize(dy_p, sizes, bwd, ROW, dgrad, wgrad, eps, pow2,
                                                  ctx.stats, ext.SLOT_GRAD_OUTPUT)
            if dgrad:
                dx = _ops.grouped_gemm_block_tokens(dy_d, dy_s, None, None, w_cw, w_cws, sizes,
                                                    gemm_dtype)[layout.rows_of].to(dy.dtype)
            if wgrad:
                dw = _ops.grouped_gemm_block_contract(dy_cw, dy_cws, x_cw, x_cws, sizes,
                                                      layout.rows, gemm_dtype).to(dy.dtype)
        if need_b:
            db = bias_grad(dy, sizes).to(ctx.bias_dtype)
        return dx, dw, db, None, None, None


def _quantize(t, sizes, fp8, mode, rowwise, columnwise, eps, pow2, stats, slot):
    """grouped_quantize_block's copies of t in the padded row layout; with
    `stats` (a logged step of fp8kit.torch.inspect) the rowwise copy is
    made in any case and the cast's statistics fill stats[slot]."""
    data, scales, cw, cw_scales = _ops.grouped_quantize_block(
        t, sizes, fp8, mode, rowwise or stats is not None, columnwise, eps, pow2)
    if stats is not None:
        parts = grouped_statistics.block_parts(t, data, scales, sizes.tolist(), mode)
        grouped_statistics.record(stats, slot, parts, mode)
    return data, scales, cw, cw_scales


def _forward(ctx, x, weight, bias, sizes, cfg, stats):
    """The forward GEMM over the padded rows; with ctx (a pass computing
    gradients) it saves the columnwise copies backward reads."""
    fwd, _, eps, pow2, dgrad, wgrad = cfg
    experts, n, k = weight.shape
    tokens = x.shape[0]
    layout = padded_layout(sizes, tokens, x.device)
    x_p = to_padded(x, layout)
    x_d, x_s, x_cw, x_cws = _quantize(x_p, sizes, fwd, ROW, True, wgrad, eps, pow2, stats,
                                      ext.SLOT_INPUT)
    # The weights as E groups of n rows (n a multiple of 16: no padding):
    # each expert's 128x128 blocks, and its transposed copy [k, n] for dgrad.
    w_sizes = torch.full((experts,), n, dtype=torch.int64)
    w_d, w_s, w_cw, w_cws = _quantize(weight.reshape(experts * n, k), w_sizes, fwd, BLOCK, True,
                                      dgrad, eps, pow2, stats, ext.SLOT_WEIGHT)
    y = _ops.grouped_gemm_block_tokens(x_d, x_s, w_d.view(experts, n, k), w_s, None, None,
                                       sizes, _gemm_dtype(x.dtype))[layout.rows_of].to(x.dtype)
    if bias is not None:
        y = y + bias[token_experts(sizes, tokens, x.device)]
    if ctx is not None:
        ctx.cfg, ctx.rows, ctx.stats = cfg, layout.rows, stats
        ctx.bias_dtype = None if bias is None else bias.dtype
        w_kept = w_cw.view(experts, k, n) if dgrad else None
        ctx.save_for_backward(x_cw if wgrad else None, x_cws if wgrad else None, w_kept,
                              w_cws if dgrad else None, sizes, layout.rows_of, layout.source,
                              layout.padding)
    return y
