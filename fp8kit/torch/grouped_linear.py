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

Every operand has one scale per expert: its tokens of x and of the
output gradient, its weight matrix. Under CurrentScaling each comes from
that expert's own amax. Under DelayedScaling each expert has a scaling
state per operand, as if it were an fp8kit.torch.Linear of its own, and
the layer follows Linear's protocol (common/include/fp8kit/linear.h): a
fresh state takes its first scale from the tensor's own amax; a forward
that computes gradients records the amaxes of x and w into their
histories and recomputes their scales, its backward those of the output
gradient; a forward that computes none (inference) casts with the current
scales and records nothing. An expert with no tokens in a step records
amax 0 for x (keeping its scale) and, as a Linear given no tokens, nothing
for the output gradient, whose cast it skips. So over any sequence of
steps the layer computes the same bits as one Linear per expert run on
that expert's tokens.

The delayed-scaling state is three buffers, in the state_dict, made on
the first DelayedScaling forward (and made anew, fresh, when a recipe
with another amax_history_len runs): fp8_amax_history [3, E,
amax_history_len] (element 0 the newest), fp8_scale and fp8_seeded [3, E,
GROUP_SCALE_STRIDE] (expert e's value in column 0, seeded 0.0 or 1.0),
the rows input, weight, grad_output. The grouped cast returns the new
state (torch.ops.fp8kit.grouped_quantize_delayed is functional) and the
layer copies it into the buffers, eagerly and under torch.compile alike.
A checkpoint without them loads with a fresh state.

The casts of all experts are one launch per tensor
(torch.ops.fp8kit.grouped_quantize / grouped_quantize_delayed), the GEMMs
one call per pass (grouped_gemm_tokens: forward and dgrad;
grouped_gemm_contract: wgrad, over each expert's tokens). Backward keeps
x and w in FP8 only. The bias gradient is each expert's sum of the
output gradient, in float32.

Under torch.autocast the input and the bias take its dtype; the weight
too under BlockScaling, while the per-tensor recipes cast a float32
weight to FP8 as it is and give it a float32 gradient, as
fp8kit.torch.Linear does.

Outside autocast the layer runs in high precision: torch._grouped_mm on
CUDA for bfloat16 where PyTorch has it, else one matmul per expert.
Under BlockScaling (1x128 tiles for x and dy, 128x128 blocks for each
expert's weight) the layer runs fp8kit.torch._grouped_block: the same
bits as fp8kit.torch.Linear under BlockScaling on each expert's tokens.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
from torch.utils._python_dispatch import _disable_current_modes

from fp8kit.recipe import CurrentScaling, DelayedScaling
from fp8kit.torch import _checks
from fp8kit.torch import _grouped_statistics as grouped_statistics
from fp8kit.torch._ext import ext
from fp8kit.torch._grouped_block import bias_grad, grouped_block_linear, sizes_on, token_experts
from fp8kit.torch.autocast import STATE as _AUTOCAST

_ops = torch.ops.fp8kit
_NAME = "fp8kit.torch.GroupedLinear"
_STATE_BUFFERS = ("fp8_amax_history", "fp8_scale", "fp8_seeded")


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{_NAME}: {name} is {value!r}; it must be a positive int")
    return value


class GroupedLinear(torch.nn.Module):
    """num_experts Linear layers over the groups of a token-sorted input."""

    # A recorder at a logged step of fp8kit.torch.inspect, else None.
    _fp8_inspect = None

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
        # The delayed-scaling state, made by the first DelayedScaling forward
        # (None buffers are left out of the state_dict until then).
        for name in _STATE_BUFFERS:
            self.register_buffer(name, None)
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
        recipe = _AUTOCAST.recipe
        # As fp8kit.torch.Linear: the per-tensor recipes cast a float32
        # (master) weight to FP8 as it is, one rounding and no copy of all
        # the experts' weights in the autocast dtype each step.
        master = torch.is_autocast_enabled(x.device.type) and weight.dtype == torch.float32 \
            and type(recipe) in (CurrentScaling, DelayedScaling)
        if torch.is_autocast_enabled(x.device.type):
            dtype = torch.get_autocast_dtype(x.device.type)
            x = x.to(dtype)
            weight = weight if master else weight.to(dtype)
            bias = None if bias is None else bias.to(dtype)
        _check_dtypes(x, weight, bias, master)
        if recipe is not None:
            _check_fp8_dims(weight)
        inspect = self._fp8_inspect
        # At a logged step the casts also fill the recorder's rows.
        stats = None if recipe is None or inspect is None else \
            inspect.linear_statistics("", x.shape[0], weight)
        if recipe is None:
            y = _high_precision(x, weight, bias, sizes)
        elif type(recipe) is CurrentScaling:
            y = _fp8(recipe, x, weight, bias, sizes, None, stats)
        elif type(recipe) is DelayedScaling:
            y = _fp8(recipe, x, weight, bias, sizes, self._delayed_state(recipe), stats)
        else:  # BlockScaling (autocast takes no other recipe)
            y = grouped_block_linear(recipe, x.contiguous(), weight.contiguous(), bias, sizes,
                                     stats)
        return y.reshape(*input.shape[:-1], self.out_features)

    def fp8_state_arrays(self, recipe) -> dict:
        """The delayed-scaling state as fp8kit.jax's
        GroupedDelayedScalingState holds it (the portable checkpoint's
        arrays): amax_history [E, 3, len], scale and seeded [E, 3] as NumPy
        float32, a fresh state's when the layer has none of this length."""
        import numpy as np
        if self.fp8_amax_history is None or \
                self.fp8_amax_history.shape[-1] != recipe.amax_history_len:
            shape = (self.num_experts, ext.NUM_SLOTS)
            return {"amax_history": np.zeros(shape + (recipe.amax_history_len,), np.float32),
                    "scale": np.ones(shape, np.float32), "seeded": np.zeros(shape, np.float32)}
        as_numpy = lambda t: np.ascontiguousarray(t.detach().cpu().numpy())  # noqa: E731
        return {"amax_history": as_numpy(self.fp8_amax_history.transpose(0, 1)),
                "scale": as_numpy(self.fp8_scale[..., 0].t()),
                "seeded": as_numpy(self.fp8_seeded[..., 0].t())}

    def load_fp8_state_arrays(self, recipe, arrays: dict) -> None:
        """fp8_state_arrays' inverse (shapes checked by torch's copy)."""
        _make_state(self, recipe.amax_history_len)
        with torch.no_grad():
            self.fp8_amax_history.copy_(torch.as_tensor(arrays["amax_history"]).transpose(0, 1))
            self.fp8_scale[..., 0].copy_(torch.as_tensor(arrays["scale"]).t())
            self.fp8_seeded[..., 0].copy_(torch.as_tensor(arrays["seeded"]).t())

    def _delayed_state(self, recipe):
        """(fp8_amax_history, fp8_scale, fp8_seeded) for `recipe`."""
        _make_state(self, recipe.amax_history_len)
        return self.fp8_amax_history, self.fp8_scale, self.fp8_seeded

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        # The state is loaded into buffers of the saved history length (any
        # other mismatch is torch's size error); a checkpoint without it
        # starts the state fresh.
        history = state_dict.get(prefix + "fp8_amax_history")
        if isinstance(history, torch.Tensor) and history.dim() > 0:
            self.fp8_amax_history = None
            _make_state(self, history.shape[-1])
        else:
            for name in _STATE_BUFFERS:
                setattr(self, name, None)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)


@torch.compiler.assume_constant_result
def _make_state(layer, amax_history_len: int) -> None:
    """Makes layer's delayed-scaling buffers, fresh, when it has none or
    ones of another history length. Under torch.compile this runs at trace
    time, outside the graph: buffers made in the graph would be its
    intermediates, which AOTAutograd refuses to let the backward update,
    while buffers made here are graph inputs, guarded as any (a later
    change of them, or of the recipe, traces again)."""
    history = layer.fp8_amax_history
    if history is not None and history.shape[-1] == amax_history_len:
        return
    shape = (ext.NUM_SLOTS, layer.num_experts)
    opts = {"dtype": torch.float32, "device": layer.weight.device}
    # Real tensors even where a non-strict torch.export's fake mode is on.
    with _disable_current_modes():
        layer.fp8_amax_history = torch.zeros(shape + (amax_history_len,), **opts)
        layer.fp8_scale = torch.ones(shape + (ext.GROUP_SCALE_STRIDE,), **opts)
        layer.fp8_seeded = torch.zeros(shape + (ext.GROUP_SCALE_STRIDE,), **opts)


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
    if group_sizes.device.type == "cpu" and not torch.compiler.is_compiling():
        _check_counts(group_sizes.tolist(), x.shape[0])
    return group_sizes.to(torch.int64).contiguous()


def _check_counts(counts: list, tokens: int) -> None:
    """Counts on the host, checked here for every recipe: the high-precision
    and block-scaled paths would meet them first in PyTorch ops with errors
    of their own. Counts on the GPU are checked where they are read anyway
    (the FP8 casts; grouped_block_linear before it pads), not outside
    autocast."""
    for e, count in enumerate(counts):
        if not 0 <= count <= tokens:
            raise ValueError(f"{_NAME}: group_sizes[{e}] is {count}; every count must be in "
                             f"[0, {tokens}] (the input's rows)")
    if sum(counts) != tokens:
        raise ValueError(f"{_NAME}: group_sizes sum to {sum(counts)} but the input has {tokens} "
                         "rows; the counts must sum to the rows exactly (sort the tokens by "
                         "expert and count every one)")


def _high_precision(x, weight, bias, sizes) -> torch.Tensor:
    grouped_mm = getattr(torch, "_grouped_mm", None)
    if (grouped_mm is not None and x.is_cuda and x.dtype == torch.bfloat16
            and weight.dtype == torch.bfloat16):
        sizes = sizes_on(sizes, x.device)  # once, for the offsets and the bias's experts
        offsets = torch.cumsum(sizes, 0, dtype=torch.int32)
        y = grouped_mm(x, weight.transpose(-2, -1), offs=offsets)
    else:
        y = torch.cat([part @ weight[e].t() for e, part in
                       enumerate(torch.split(x, sizes.tolist()))])
    if bias is not None:
        y = y + bias[token_experts(sizes, x.shape[0], x.device)]
    return y


class _Config(NamedTuple):
    """What a call's casts and GEMMs need of the recipe and the pass."""
    fwd: torch.dtype
    bwd: torch.dtype
    fast: bool             # forward_fast_accumulation
    dgrad: bool
    wgrad: bool
    amax_epsilon: float    # CurrentScaling
    power_2_scale: bool    # CurrentScaling
    margin: int            # DelayedScaling
    amax_reduction: str    # DelayedScaling


def _check_dtypes(x, weight, bias, master_weight: bool) -> None:
    for name, t in (("weight", weight), ("bias", bias)):
        if name == "weight" and master_weight:
            continue
        if t is not None and t.dtype != x.dtype:
            raise RuntimeError(f"{_NAME}: input has dtype {x.dtype} but {name} has dtype "
                               f"{t.dtype}; they must match (convert one, or run under "
                               "torch.autocast)")


def _check_fp8_dims(weight) -> None:
    for name, v in (("in_features", weight.shape[2]), ("out_features", weight.shape[1])):
        if v % ext.GEMM_DIM_MULTIPLE:
            raise ValueError(f"{_NAME}: {name} is {v}, but FP8 GEMMs need it to be a multiple "
                             f"of {ext.GEMM_DIM_MULTIPLE}; pad the layer or run it outside "
                             "fp8kit.torch.autocast")


def _fp8(recipe, x, weight, bias, sizes, state: Optional[tuple], stats) -> torch.Tensor:
    grad = torch.is_grad_enabled()
    dgrad = grad and x.requires_grad
    wgrad = grad and weight.requires_grad
    fmt = recipe.fp8_format
    delayed = state is not None
    cfg = _Config(_checks.TORCH_FP8[fmt.forward_dtype], _checks.TORCH_FP8[fmt.backward_dtype],
                  bool(recipe.forward_fast_accumulation), dgrad, wgrad,
                  0.0 if delayed else float(recipe.amax_epsilon),
                  False if delayed else bool(recipe.power_2_scale),
                  recipe.margin if delayed else 0,
                  recipe.amax_reduction.value if delayed else "max")
    x = x.contiguous()
    if dgrad or wgrad or (grad and bias is not None and bias.requires_grad):
        return _GroupedLinearFunction.apply(x, weight.contiguous(), bias, sizes, cfg, state,
                                            stats)
    return _forward(None, x, weight.contiguous(), bias, sizes, cfg, state, stats)


def _quantize(x, sizes, fp8, rowwise, columnwise, cfg, state, slot, record, stats,
              skip_empty=False):
    """(data, columnwise copy, scale_inv) of the token-grouped x: current
    scaling (state None), or delayed with row `slot` of the state, whose
    buffers receive the new state when `record`, except the rows of groups
    with no tokens when `skip_empty`. With `stats` (a logged step of
    fp8kit.torch.inspect) the rowwise copy is made in any case and the
    cast's statistics fill stats[slot]."""
    data, cw, scale_inv = _cast(x, sizes, fp8, rowwise or stats is not None, columnwise, cfg,
                                state, slot, record, skip_empty)
    if stats is not None:
        parts = grouped_statistics.per_tensor_parts(
            x, data, scale_inv, token_experts(sizes, x.shape[0], x.device))
        grouped_statistics.record(stats, slot, parts, "per_row")
    return data, cw, scale_inv


def _cast(x, sizes, fp8, rowwise, columnwise, cfg, state, slot, record, skip_empty):
    if state is None:
        data, cw, _, scale_inv, _ = _ops.grouped_quantize(x, sizes, fp8, rowwise, columnwise,
                                                          None, cfg.amax_epsilon,
                                                          cfg.power_2_scale)
        return data, cw, scale_inv
    old = [t[slot] for t in state]
    data, cw, scale_inv, *new = _ops.grouped_quantize_delayed(
        x, sizes, fp8, rowwise, columnwise, *old, cfg.margin, cfg.amax_reduction, record)
    if record:
        if skip_empty:
            used = sizes_on(sizes > 0, x.device).unsqueeze(1)
            new = [torch.where(used, n, o) for n, o in zip(new, old)]
        # Whole buffers copied: AOTAutograd takes a backward's mutation of
        # a forward input as a copy_ into it, not as one into a view.
        for t, n in zip(state, new):
            t.copy_(torch.cat([t[:slot], n.unsqueeze(0), t[slot + 1:]]))
    return data, cw, scale_inv


class _GroupedLinearFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, weight, bias, sizes, cfg, state, stats):
        return _forward(ctx, x, weight, bias, sizes, cfg, state, stats)

    @staticmethod
    def backward(ctx, dy):
        x_cw, x_sinv, w_cw, w_sinv, sizes = ctx.saved_tensors
        cfg = ctx.cfg
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dgrad, wgrad = cfg.dgrad and need_x, cfg.wgrad and need_w
        dy = dy.contiguous()
        dx = dw = db = None
        if dgrad or wgrad:
            # An expert with no tokens records nothing here, as a Linear
            # given no tokens casts no output gradient.
            dy_d, dy_cw, dy_sinv = _quantize(dy, sizes, cfg.bwd, dgrad, wgrad, cfg, ctx.state,
                                             ext.SLOT_GRAD_OUTPUT, True, ctx.stats,
                                             skip_empty=True)
            if dgrad:
                dx = _ops.grouped_gemm_tokens(dy_d, dy_sinv, None, w_cw, w_sinv, sizes, False,
                                              dy.dtype)
            if wgrad:
                dw = _ops.grouped_gemm_contract(dy_cw, dy_sinv, x_cw, x_sinv, sizes,
                                                dy.shape[0], ctx.weight_dtype)
        if need_b:
            db = bias_grad(dy, sizes).to(ctx.bias_dtype)
        return dx, dw, db, None, None, None, None


def _forward(ctx, x, weight, bias, sizes, cfg, state, stats):
    """y = x_e @ w_e^T (+ b_e) per expert e; with ctx (a pass computing
    gradients, which records the casts' amaxes under delayed scaling) it
    saves the FP8 copies backward reads."""
    experts, n, k = weight.shape
    record = ctx is not None
    x_d, x_cw, x_sinv = _quantize(x, sizes, cfg.fwd, True, cfg.wgrad, cfg, state,
                                  ext.SLOT_INPUT, record, stats)
    # The weights as E groups of n rows: the grouped columnwise copy then
    # begins with each expert's transpose [k, n], back to back (n is a
    # multiple of 16, so no block is padded).
    w_sizes = torch.full((experts,), n, dtype=torch.int64)
    w_d, w_cw, w_sinv = _quantize(weight.reshape(experts * n, k), w_sizes, cfg.fwd, True,
                                  cfg.dgrad, cfg, state, ext.SLOT_WEIGHT, record, stats)
    # The bias epilogue takes a bias in D's dtype for 16-bit outputs and
    # would round a float32 bias to bfloat16 for a float32 output.
    fused_bias = bias if bias is not None and x.dtype != torch.float32 else None
    y = _ops.grouped_gemm_tokens(x_d, x_sinv, w_d.view(experts, n, k), None, w_sinv, sizes, True,
                                 x.dtype, fused_bias, not cfg.fast)
    if bias is not None and fused_bias is None:
        y = y + bias[token_experts(sizes, x.shape[0], x.device)]
    if ctx is not None:
        ctx.cfg = cfg
        # The state is not saved: the backward's cast updates the buffers.
        ctx.state, ctx.stats = state, stats
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.weight_dtype = weight.dtype
        w_kept = w_cw[:experts * k * n].view(experts, k, n) if cfg.dgrad else None
        ctx.save_for_backward(x_cw if cfg.wgrad else None, x_sinv, w_kept, w_sinv, sizes)
    return y
