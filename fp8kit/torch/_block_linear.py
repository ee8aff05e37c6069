"""The FP8 Linear under fp8kit.recipe.BlockScaling, for fp8kit.torch.Linear
and the fused layers' GEMMs.

Block scaling keeps no state (each block's scale comes from its own amax),
so this path has none of the per-tensor layer's scaling slots or
histories. Its protocol is C++'s (torch_ext/block_linear.cc, after
fp8kit/linear.h): the dispatcher ops torch.ops.fp8kit.block_linear_forward
(x and w cast once each, the forward GEMM, the columnwise copies the
gradients read kept, never a high-precision x) and block_linear_backward
(dy cast once, dgrad, wgrad, the bias gradient), with the token count
padded inside them. This module is their autograd.Function, which
torch.compile traces as it is, and the layers' checks.

Outputs: the GEMMs write bfloat16 or float32; a float16 layer computes in
float32 and rounds once. in_features and out_features must be multiples
of GEMM_DIM_MULTIPLE (each is the contraction of one GEMM).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fp8kit.torch import _checks
from fp8kit.torch._ext import ext
from fp8kit.torch._outputs import layer_output
from fp8kit.torch.quantized_tensor import QuantizedTensor

_ops = torch.ops.fp8kit
# The fewest token rows the GEMMs run on while torch.compile traces: the
# scales of a 1x128 columnwise copy have a row per 128 tokens, and PyTorch
# records every traced tensor's contiguity by testing each size against 1,
# which for a symbolic token count would split the graph at 128 tokens. Two
# blocks at least keep that size above 1 (the extra zero rows change no
# result).
_MIN_TRACED_ROWS = ext.BLOCK_LEN + ext.GEMM_DIM_MULTIPLE
_tracing = torch.compiler.is_compiling


class _BlockLinearFunction(torch.autograd.Function):
    """y = x @ w^T (+ bias) on [M, K] x."""

    @staticmethod
    def forward(ctx, x, weight, bias, cfg, statistics):
        fwd, _, eps, pow2, dgrad, wgrad, min_rows = cfg
        y, x_cw, x_cw_sinv, w_cw, w_cw_sinv = _ops.block_linear_forward(
            x, weight, bias, fwd, eps, pow2, dgrad, wgrad, min_rows, statistics)
        ctx.cfg, ctx.statistics, ctx.in_features = cfg, statistics, weight.shape[1]
        ctx.save_for_backward(x_cw, x_cw_sinv, w_cw, w_cw_sinv)
        return y

    @staticmethod
    def backward(ctx, dy):
        _, bwd, eps, pow2, dgrad, wgrad, min_rows = ctx.cfg
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dgrad, wgrad = dgrad and need_x, wgrad and need_w
        dx, dw, db = _ops.block_linear_backward(
            dy.contiguous(), *ctx.saved_tensors, bwd, eps, pow2, ctx.in_features, dgrad, wgrad,
            need_b, min_rows, ctx.statistics)
        return dx if dgrad else None, dw if wgrad else None, db if need_b else None, None, None


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
    grad = torch.is_grad_enabled()
    dgrad = grad and x.requires_grad
    wgrad = grad and weight.requires_grad
    fmt = recipe.fp8_format
    cfg = (_checks.TORCH_FP8[fmt.forward_dtype], _checks.TORCH_FP8[fmt.backward_dtype],
           float(recipe.amax_epsilon), bool(recipe.power_2_scale), dgrad, wgrad,
           _MIN_TRACED_ROWS if _tracing() else 0)
    statistics = None if inspect is None else inspect.linear_statistics(gemm, m, weight)
    x, weight = x.contiguous(), weight.contiguous()
    if dgrad or wgrad or (grad and bias is not None and bias.requires_grad):
        y = _BlockLinearFunction.apply(x, weight, bias, cfg, statistics)
    else:
        fwd, _, eps, pow2, _, _, min_rows = cfg
        y = _ops.block_linear_forward(x, weight, bias, fwd, eps, pow2, False, False, min_rows,
                                      statistics)[0]
    return layer_output(y, input, n)
