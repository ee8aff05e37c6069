"""The FP8 Linear under fp8kit.recipe.BlockScaling, for fp8kit.torch.Linear
and the fused layers' GEMMs.

Block scaling keeps no state (each block's scale comes from its own amax),
so this path has none of the per-tensor layer's scaling slots, histories or
C++ autograd node (torch_ext/linear_*.cc, which stays as fast as it was):
it is an autograd.Function over the block-scaled dispatcher ops, which
torch.compile traces as they are. The three GEMMs, as
common/include/fp8kit/gemm.h lays them out:

    forward  y  = x @ w^T   x 1x128 rowwise,    w 128x128 rowwise
    dgrad    dx = dy @ w    dy 1x128 rowwise,   w 128x128 columnwise
    wgrad    dw = dy^T @ x  dy 1x128 columnwise, x 1x128 columnwise

x and w are quantized once each in the forward, with the copies the
gradients asked for need; backward keeps x's and w's columnwise FP8 copies
(and their scales), never a high-precision x. dy is quantized once, both
copies in one pass. All GEMMs accumulate in FP32 (the only mode cuBLASLt's
block-scaled kernels have).

Token counts: the GEMMs need the token dimension M to be a multiple of 8
(forward, dgrad) and 16 (wgrad, where M is the contraction), so x is
zero-padded to a multiple of 16 rows when it is not. Zero rows leave every
other tile's scale unchanged (a 1x128 tile of x's rowwise copy lies in one
row; a columnwise tile's amax is unchanged by zeros), so the result equals
the unpadded product; their outputs are dropped and their gradients are
zero. in_features and out_features must be multiples of GEMM_DIM_MULTIPLE
(each is the contraction of one GEMM).

Outputs: the GEMMs write bfloat16 or float32; a float16 layer computes in
float32 and rounds once. The bias goes into the forward GEMM's epilogue
for bfloat16 and is added afterwards otherwise; its gradient is dy's
column sums in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import statically_known_true

from fp8kit.torch import _checks
from fp8kit.torch._ext import ext
from fp8kit.torch._outputs import layer_output
from fp8kit.torch.quantized_tensor import QuantizedTensor

_ops = torch.ops.fp8kit
ROW, BLOCK = "block_1x128", "block_128x128"
# The token count's multiple (the wgrad GEMM's contraction).
_TOKEN_MULTIPLE = ext.GEMM_DIM_MULTIPLE
# The fewest rows x has while torch.compile traces: the scales of a 1x128
# columnwise copy have a row per 128 tokens, and PyTorch records every
# traced tensor's contiguity by testing each size against 1, which for a
# symbolic token count would split the graph at 128 tokens. Two blocks at
# least keep that size above 1 (the extra zero rows change no result).
_MIN_TRACED_ROWS = ext.BLOCK_LEN + _TOKEN_MULTIPLE
_tracing = torch.compiler.is_compiling


def _traced_rows(rows):
    """max(rows, _MIN_TRACED_ROWS) without a guard on a symbolic count
    (torch.sym_max); a static count takes the plain max, since dynamo
    (torch 2.11) refuses a torch.* call that returns an int."""
    if isinstance(rows, torch.SymInt):
        return torch.sym_max(rows, _MIN_TRACED_ROWS)
    return max(rows, _MIN_TRACED_ROWS)


def _gemm_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.bfloat16 if dtype == torch.bfloat16 else torch.float32


class _BlockLinearFunction(torch.autograd.Function):
    """y = x @ w^T (+ bias) on [M, K] x with M a multiple of 16."""

    @staticmethod
    def forward(ctx, x, weight, bias, cfg, inspect):
        return _forward(ctx, x, weight, bias, cfg, inspect)

    @staticmethod
    def backward(ctx, dy):
        x_cw, x_cw_sinv, w_cw, w_cw_sinv = ctx.saved_tensors
        fwd, bwd, eps, pow2, dgrad, wgrad = ctx.cfg
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dgrad, wgrad = dgrad and need_x, wgrad and need_w
        dy = dy.contiguous()
        dx = dw = db = None
        if dgrad or wgrad:
            dy_d, dy_s, dy_cw, dy_cws = _ops.quantize_block(dy, bwd, ROW, dgrad, wgrad, eps, pow2)
            if ctx.inspect is not None:
                recorder, gemm, tokens = ctx.inspect
                recorder.record(gemm, "grad_output", dy, dy_d if dgrad else None,
                                dy_s if dgrad else dy_cws, ROW, dy_cw, tokens * dy.shape[1])
            gemm_dtype = _gemm_dtype(dy.dtype)
            if dgrad:
                dx = _ops.gemm_block(dy_d, dy_s, None, None, ROW, None, None, w_cw, w_cw_sinv,
                                     BLOCK, False, False, gemm_dtype, None).to(dy.dtype)
            if wgrad:
                dw = _ops.gemm_block(None, None, dy_cw, dy_cws, ROW, None, None, x_cw, x_cw_sinv,
                                     ROW, True, False, gemm_dtype, None).to(dy.dtype)
        if need_b:
            db = dy.sum(0, dtype=torch.float32).to(ctx.bias_dtype)
        return dx, dw, db, None, None


def _forward(ctx, x, weight, bias, cfg, inspect):
    """The forward GEMM; with ctx (a pass that computes gradients) it saves
    the columnwise copies backward reads. inspect: None, or (the layer's
    recorder of fp8kit.torch.inspect, the GEMM's name in it, the token
    count before padding)."""
    fwd, bwd, eps, pow2, dgrad, wgrad = cfg
    x_d, x_s, x_cw, x_cws = _ops.quantize_block(x, fwd, ROW, True, wgrad, eps, pow2)
    w_d, w_s, w_cw, w_cws = _ops.quantize_block(weight, fwd, BLOCK, True, dgrad, eps, pow2)
    if inspect is not None:
        recorder, gemm, tokens = inspect
        recorder.record(gemm, "input", x, x_d, x_s, ROW, numel=tokens * x.shape[1])
        recorder.record(gemm, "weight", weight, w_d, w_s, BLOCK)
    gemm_dtype = _gemm_dtype(x.dtype)
    fused_bias = bias if bias is not None and gemm_dtype == torch.bfloat16 else None
    y = _ops.gemm_block(x_d, x_s, None, None, ROW, w_d, w_s, None, None, BLOCK, False, True,
                        gemm_dtype, fused_bias)
    if bias is not None and fused_bias is None:
        y = y + bias
    if ctx is not None:
        ctx.cfg, ctx.inspect = cfg, inspect
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.save_for_backward(x_cw if wgrad else None, x_cws if wgrad else None,
                              w_cw if dgrad else None, w_cws if dgrad else None)
    # y itself when the dtypes match: .to() would return an alias of it,
    # which torch 2.11's dynamo treats as a second output and routes the
    # gradient to (pytorch/pytorch#180642: compiled gradients came out zero).
    return y if y.dtype == x.dtype else y.to(x.dtype)


def check_features(layer: str, in_features: int, out_features: int) -> None:
    """ValueError naming the layer unless both are multiples of
    GEMM_DIM_MULTIPLE."""
    m = ext.GEMM_DIM_MULTIPLE
    for name, v in (("in_features", in_features), ("out_features", out_features)):
        if v % m:
            raise ValueError(
                f"fp8kit.torch.{layer}: {name} is {v}, but BlockScaling's FP8 GEMMs need "
                f"in_features and out_features to be multiples of {m}; pad the layer or run it "
                "outside fp8kit.torch.autocast")


def block_linear(layer: str, recipe, input: torch.Tensor, weight: torch.Tensor,
                 bias, inspect=None, gemm: str = "") -> torch.Tensor:
    """y = input @ weight^T + bias with BlockScaling `recipe`; errors name
    fp8kit.torch.<layer>. inspect: the layer's recorder at a logged step of
    fp8kit.torch.inspect (its casts report as the GEMM `gemm`), else None."""
    fn = f"fp8kit.torch.{layer}"
    if isinstance(weight, QuantizedTensor):
        raise TypeError(
            f"{fn}: the weight is an fp8kit {type(weight).__name__} (a per-tensor FP8 weight, "
            "e.g. from FSDP2's FP8 all-gather), but BlockScaling quantizes the weight per "
            "128x128 block itself. Run this layer with DelayedScaling or CurrentScaling, or "
            "all-gather the weight in high precision")
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"{fn}: input must be a torch.Tensor, got {type(input).__name__}")
    for name, t in (("input", input), ("weight", weight), ("bias", bias)):
        if t is not None and t.dtype not in _checks.HIGH_PRECISION:
            raise TypeError(f"{fn}: {name} has dtype {t.dtype}; FP8 layers take torch.float32, "
                            "torch.bfloat16 or torch.float16")
        if t is not None and t.dtype != input.dtype:
            raise RuntimeError(f"{fn}: input has dtype {input.dtype} but {name} has dtype "
                               f"{t.dtype}; they must match (convert one, or run under "
                               "torch.autocast)")
    n, k = weight.shape
    if input.dim() < 1 or input.shape[-1] != k:
        raise ValueError(f"{fn}: input has shape {list(input.shape)} but the layer takes "
                         f"{k} features; the last dimension of input must equal it")
    check_features(layer, k, n)
    x = input.reshape(-1, k)
    m = x.shape[0]
    if m == 0:  # no tokens: nothing to quantize
        return F.linear(input, weight, bias)
    pad = -m % _TOKEN_MULTIPLE
    if _tracing():
        pad = _traced_rows(m + pad) - m
    # A symbolic pad (torch.compile's dynamic token count) is applied even
    # where it is 0: testing it would specialize the graph on the count.
    padded = not statically_known_true(pad == 0)
    if padded:
        x = F.pad(x, (0, 0, 0, pad))
    grad = torch.is_grad_enabled()
    dgrad = grad and x.requires_grad
    wgrad = grad and weight.requires_grad
    fmt = recipe.fp8_format
    cfg = (_checks.TORCH_FP8[fmt.forward_dtype], _checks.TORCH_FP8[fmt.backward_dtype],
           float(recipe.amax_epsilon), bool(recipe.power_2_scale), dgrad, wgrad)
    if inspect is not None:
        inspect = (inspect, gemm, m)
    if dgrad or wgrad or (grad and bias is not None and bias.requires_grad):
        y = _BlockLinearFunction.apply(x.contiguous(), weight.contiguous(), bias, cfg, inspect)
    else:
        y = _forward(None, x.contiguous(), weight.contiguous(), bias, cfg, inspect)
    if padded:
        y = y[:m]
    return layer_output(y, input, n)
