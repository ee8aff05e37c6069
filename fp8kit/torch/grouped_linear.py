"""fp8kit.torch.GroupedLinear: the expert layer of a mixture of experts,
E Linear layers applied each to its own group of tokens, with FP8 GEMMs
inside fp8kit.torch.autocast.

    layer = GroupedLinear(num_experts, in_features, out_features)
    y = layer(x, group_sizes)    # x [tokens, in_features], sorted by expert

x holds the tokens of expert 0, then those of expert 1, and so on
(contiguous layout); group_sizes gives each expert's count (a list of
ints, or an int64 tensor [E] on the CPU or on x's device; zero is
allowed, and the counts must sum to the tokens). y[t] = x[t] @ w[e]^T +
b[e] for the expert e that token t belongs to. weight is [E, out, in]
(each expert's matrix as torch.nn.Linear holds it), bias [E, out].

Counts on the host cost nothing; counts on the GPU are read back by each
grouped call (a wait for the stream), since the per-expert GEMMs are
planned on the host (fp8kit/grouped.h).

Under CurrentScaling every operand has one scale per expert, from that
expert's own amax: its tokens of x and of the output gradient, its
weight matrix. The casts of all experts are one launch per tensor
(torch.ops.fp8kit.grouped_quantize), the GEMMs one call per pass
(grouped_gemm_tokens: forward and dgrad; grouped_gemm_contract: wgrad,
over each expert's tokens). Backward keeps x and w in FP8 only. The bias
gradient is each expert's sum of the output gradient, in float32.

Outside autocast the layer runs in high precision: torch._grouped_mm on
CUDA for bfloat16 where PyTorch has it, else one matmul per expert.
DelayedScaling (a scaling history per expert) and BlockScaling are not
supported by GroupedLinear yet and raise NotImplementedError.
"""

from __future__ import annotations

import math

import torch

from fp8kit.recipe import CurrentScaling
from fp8kit.torch import _checks
from fp8kit.torch._ext import ext
from fp8kit.torch.autocast import STATE as _AUTOCAST

_ops = torch.ops.fp8kit
_NAME = "fp8kit.torch.GroupedLinear"


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{_NAME}: {name} is {value!r}; it must be a positive int")
    return value


class GroupedLinear(torch.nn.Module):
    """num_experts Linear layers over the groups of a token-sorted input."""

    def __init__(self, num_experts: int, in_features: int, out_features: int, bias: bool = True,
                 device=None, dtype=None) -> None:
        super().__init__()
        self.num_experts = _positive_int("num_experts", num_experts)
        self.in_features = _positive_int("in_features", in_features)
        self.out_features = _positive_int("out_features", out_features)
        factory = {"device": device, "dtype": dtype}
        self.weight = torch.nn.Parameter(
            torch.empty((num_experts, out_features, in_features), **factory))
        if bias:
            self.bias = torch.nn.Parameter(torch.empty((num_experts, out_features), **factory))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Each expert as torch.nn.Linear initializes its weight and bias."""
        for e in range(self.num_experts):
            torch.nn.init.kaiming_uniform_(self.weight[e], a=math.sqrt(5))
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.in_features)
            torch.nn.init.uniform_(self.bias, -bound, bound)

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, in_features={self.in_features}, "
                f"out_features={self.out_features}, bias={self.bias is not None}")

    def forward(self, input: torch.Tensor, group_sizes) -> torch.Tensor:
        x = _check_input(input, self.in_features)
        sizes = _group_sizes(group_sizes, self.num_experts, x)
        weight, bias = self.weight, self.bias
        if torch.is_autocast_enabled(x.device.type):
            dtype = torch.get_autocast_dtype(x.device.type)
            x, weight = x.to(dtype), weight.to(dtype)
            bias = None if bias is None else bias.to(dtype)
        recipe = _AUTOCAST.recipe
        if recipe is None:
            y = _high_precision(x, weight, bias, sizes)
        elif type(recipe) is CurrentScaling:
            y = _fp8(recipe, x, weight, bias, sizes)
        else:
            raise NotImplementedError(
                f"{_NAME}: the recipe is {type(recipe).__name__}, but GroupedLinear runs FP8 "
                "with CurrentScaling only so far (one scale per expert from its own amax); "
                "use fp8kit.recipe.CurrentScaling for this layer")
        return y.reshape(*input.shape[:-1], self.out_features)


def _check_input(input, in_features: int) -> torch.Tensor:
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"{_NAME}: input must be a torch.Tensor, got {type(input).__name__}")
    if input.dtype not in _checks.HIGH_PRECISION:
        raise TypeError(f"{_NAME}: input has dtype {input.dtype}; pass torch.float32, "
                        "torch.bfloat16 or torch.float16")
    if input.dim() < 1 or input.shape[-1] != in_features:
        raise ValueError(f"{_NAME}: input has shape {list(input.shape)} but the layer takes "
                         f"{in_features} features; the last dimension must equal it")
    return input.reshape(-1, in_features)


def _group_sizes(group_sizes, num_experts: int, x: torch.Tensor) -> torch.Tensor:
    """The counts as an int64 tensor [E] on the CPU or x's device."""
    if isinstance(group_sizes, (list, tuple)):
        if not all(isinstance(s, int) and not isinstance(s, bool) for s in group_sizes):
            raise TypeError(f"{_NAME}: group_sizes must hold ints, got {group_sizes!r}")
        group_sizes = torch.tensor(group_sizes, dtype=torch.int64)
    if not isinstance(group_sizes, torch.Tensor):
        raise TypeError(f"{_NAME}: group_sizes must be a list of ints or an int64 tensor, got "
                        f"{type(group_sizes).__name__}")
    if group_sizes.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{_NAME}: group_sizes has dtype {group_sizes.dtype}; pass the counts "
                        "as torch.int64 (or int32)")
    if tuple(group_sizes.shape) != (num_experts,):
        raise ValueError(f"{_NAME}: group_sizes has shape {list(group_sizes.shape)} but the "
                         f"layer has {num_experts} experts; pass one count per expert")
    if group_sizes.device.type != "cpu" and group_sizes.device != x.device:
        raise ValueError(f"{_NAME}: group_sizes is on {group_sizes.device} but input is on "
                         f"{x.device}; pass the counts on the CPU or on {x.device}")
    return group_sizes.to(torch.int64).contiguous()


def _token_experts(sizes: torch.Tensor, tokens, device) -> torch.Tensor:
    """Each token's expert index, [tokens] on `device`, with no host read."""
    experts = torch.arange(sizes.shape[0], device=sizes.device)
    return torch.repeat_interleave(experts, sizes, output_size=tokens).to(device)


def _high_precision(x, weight, bias, sizes) -> torch.Tensor:
    grouped_mm = getattr(torch, "_grouped_mm", None)
    if (grouped_mm is not None and x.is_cuda and x.dtype == torch.bfloat16
            and weight.dtype == torch.bfloat16):
        offsets = torch.cumsum(sizes.to(x.device), 0, dtype=torch.int32)
        y = grouped_mm(x, weight.transpose(-2, -1), offs=offsets)
    else:
        y = torch.cat([part @ weight[e].t() for e, part in
                       enumerate(torch.split(x, sizes.tolist()))])
    if bias is not None:
        y = y + bias[_token_experts(sizes, x.shape[0], x.device)]
    return y


def _fp8(recipe, x, weight, bias, sizes) -> torch.Tensor:
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.dtype != x.dtype:
            raise RuntimeError(f"{_NAME}: input has dtype {x.dtype} but {name} has dtype "
                               f"{t.dtype}; they must match (convert one, or run under "
                               "torch.autocast)")
    for name, v in (("in_features", weight.shape[2]), ("out_features", weight.shape[1])):
        if v % ext.GEMM_DIM_MULTIPLE:
            raise ValueError(f"{_NAME}: {name} is {v}, but FP8 GEMMs need it to be a multiple "
                             f"of {ext.GEMM_DIM_MULTIPLE}; pad the layer or run it outside "
                             "fp8kit.torch.autocast")
    grad = torch.is_grad_enabled()
    dgrad = grad and x.requires_grad
    wgrad = grad and weight.requires_grad
    fmt = recipe.fp8_format
    cfg = (_checks.TORCH_FP8[fmt.forward_dtype], _checks.TORCH_FP8[fmt.backward_dtype],
           float(recipe.amax_epsilon), bool(recipe.power_2_scale),
           bool(recipe.forward_fast_accumulation), dgrad, wgrad)
    x = x.contiguous()
    if dgrad or wgrad or (grad and bias is not None and bias.requires_grad):
        return _GroupedLinearFunction.apply(x, weight.contiguous(), bias, sizes, cfg)
    return _forward(None, x, weight.contiguous(), bias, sizes, cfg)


class _GroupedLinearFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, weight, bias, sizes, cfg):
        return _forward(ctx, x, weight, bias, sizes, cfg)

    @staticmethod
    def backward(ctx, dy):
        x_cw, x_sinv, w_cw, w_sinv, sizes = ctx.saved_tensors
        _, bwd, eps, pow2, _, dgrad, wgrad = ctx.cfg
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dgrad, wgrad = dgrad and need_x, wgrad and need_w
        dy = dy.contiguous()
        dx = dw = db = None
        if dgrad or wgrad:
            dy_d, dy_cw, _, dy_sinv, _ = _ops.grouped_quantize(dy, sizes, bwd, dgrad, wgrad, None,
                                                               eps, pow2)
            if dgrad:
                dx = _ops.grouped_gemm_tokens(dy_d, dy_sinv, None, w_cw, w_sinv, sizes, False,
                                              dy.dtype)
            if wgrad:
                dw = _ops.grouped_gemm_contract(dy_cw, dy_sinv, x_cw, x_sinv, sizes,
                                                dy.shape[0], dy.dtype)
        if need_b:
            experts = _token_experts(sizes, dy.shape[0], dy.device)
            db = torch.zeros((sizes.shape[0], dy.shape[1]), dtype=torch.float32,
                             device=dy.device).index_add_(0, experts, dy.float())
            db = db.to(ctx.bias_dtype)
        return dx, dw, db, None, None


def _forward(ctx, x, weight, bias, sizes, cfg):
    """y = x_e @ w_e^T (+ b_e) per expert e; with ctx (a pass computing
    gradients) it saves the FP8 copies backward reads."""
    fwd, _, eps, pow2, fast, dgrad, wgrad = cfg
    experts, n, k = weight.shape
    x_d, x_cw, _, x_sinv, _ = _ops.grouped_quantize(x, sizes, fwd, True, wgrad, None, eps, pow2)
    # The weights as E groups of n rows: the grouped columnwise copy then
    # begins with each expert's transpose [k, n], back to back (n is a
    # multiple of 16, so no block is padded).
    w_sizes = torch.full((experts,), n, dtype=torch.int64)
    w_d, w_cw, _, w_sinv, _ = _ops.grouped_quantize(weight.reshape(experts * n, k), w_sizes, fwd,
                                                    True, dgrad, None, eps, pow2)
    # The bias epilogue takes a bias in D's dtype for 16-bit outputs and
    # would round a float32 bias to bfloat16 for a float32 output.
    fused_bias = bias if bias is not None and x.dtype != torch.float32 else None
    y = _ops.grouped_gemm_tokens(x_d, x_sinv, w_d.view(experts, n, k), None, w_sinv, sizes, True,
                                 x.dtype, fused_bias, not fast)
    if bias is not None and fused_bias is None:
        y = y + bias[_token_experts(sizes, x.shape[0], x.device)]
    if ctx is not None:
        ctx.cfg = cfg
        ctx.bias_dtype = None if bias is None else bias.dtype
        w_kept = w_cw[:experts * k * n].view(experts, k, n) if dgrad else None
        ctx.save_for_backward(x_cw if wgrad else None, x_sinv, w_kept, w_sinv, sizes)
    return y
