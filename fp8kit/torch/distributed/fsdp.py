"""FSDP2 (torch.distributed.fsdp.fully_shard) with the GEMM weights of
fp8kit's layers (Linear, LayerNormLinear, LayerNormMLP) all-gathered in
FP8: half the bytes of bf16.

    fp8kit.torch.distributed.enable_fp8_all_gather(model)   # before fully_shard
    for layer in model.layers:
        fully_shard(layer, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    fully_shard(model)

enable_fp8_all_gather wraps each GEMM weight of those layers (a Linear's
weight; a LayerNormLinear's weight; a LayerNormMLP's fc1_weight and
fc2_weight) in an FP8AllGatherWeight: the parameter keeps its
high-precision values (what the optimizer updates and checkpoints hold),
and implements FSDP2's extension points for tensor subclasses. Before each
all-gather, fsdp_pre_all_gather casts this rank's shard to FP8 with the
scale every rank shares; after it, fsdp_post_all_gather makes the gathered
bytes a Float8Tensor, which the layer's GEMMs read as they are
(fp8kit.torch._fp8_weight, fp8kit.torch._fused_module.weight_args). The
other parameters (biases, a norm's weight and bias) are gathered as they
are.

The shared scale, per recipe (the one of the fp8kit.torch.autocast around
the forward, else the default recipe):
- CurrentScaling: from the amax of the whole weight, the max of the shards'
  amaxes, all-reduced over the FSDP group (one float per layer and
  all-gather);
- DelayedScaling: the weight scale of the layer's state for that GEMM,
  which is the same on every rank: the first all-gather of a fresh state
  seeds it from the whole weight's amax (all-reduced as above); every
  all-gather casts with it, and the layer's forward, when it computes
  gradients, records the amax of the shard its all-gather cast in the
  weight's history (once per all-gather), which AmaxSync turns into the
  whole weight's amax and a new scale
  (fp8kit.torch.distributed.amax_sync). Without AmaxSync the weight's scale
  stays the seed: the same on every rank, never updated.
Both all-reduces carry a signature of the recipe, so ranks running
different recipes raise at once. BlockScaling, which casts each weight per
128x128 block itself, is refused with an error naming the fix.

A gather outside fp8kit.torch.autocast (the re-gather in backward with
reshard_after_forward=True, since autograd runs backward outside the
forward's autocast; an eval forward) casts with the recipe of the layer's
last gather under autocast (the default recipe before any), so a
re-gather in backward casts with the same scale as the forward and records
nothing; backward reads the forward's FP8 weight. reshard_after_forward as
an int (resharding to a smaller group) is not supported by FSDP2 for such
parameters. Outside fp8kit.torch.autocast the gathered weight is still FP8
(FSDP2 fixes the all-gather's dtype at the first one), and the layer
computes with it dequantized.
"""

from __future__ import annotations

import weakref

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils._pytree import tree_map_only

from fp8kit.recipe import BlockScaling, CurrentScaling
from fp8kit.torch import _checks, ops
from fp8kit.torch.autocast import DEFAULT_RECIPE, current_recipe
from fp8kit.torch.distributed import _group
from fp8kit.torch.float8_tensor import Float8Tensor

_FN = "fp8kit.torch.distributed.enable_fp8_all_gather"
_WEIGHT = 1  # the weight's slot in a GEMM's scaling state (fp8kit/linear.h)
aten = torch.ops.aten
# Per layer, kept off the module (which pickles its __dict__): the states
# whose weight scale is seeded, and per GEMM the amax of the shard the last
# all-gather cast, waiting for the layer's forward to record it.
_SEEDED = weakref.WeakKeyDictionary()
_PENDING_AMAX = weakref.WeakKeyDictionary()
# Per layer, the recipe of its last all-gather under fp8kit.torch.autocast.
_GATHER_RECIPE = weakref.WeakKeyDictionary()

# Ops whose result is (a view, copy or piece of) the parameter itself: FSDP2
# shards, pads and moves the parameter with them, and the result must stay
# an FP8AllGatherWeight. Every other op returns plain tensors.
_KEEPS_WRAPPER = frozenset({
    aten.detach.default, aten.alias.default, aten.view.default, aten._unsafe_view.default,
    aten.as_strided.default, aten.slice.Tensor, aten.split.Tensor, aten.split_with_sizes.default,
    aten.narrow.default, aten.new_zeros.default, aten.new_empty.default,
    aten.new_empty_strided.default, aten.empty_like.default, aten.zeros_like.default,
    aten.clone.default, aten._to_copy.default,
})


def _gemm_weights(module: torch.nn.Module) -> dict:
    """{weight parameter name: its GEMM's name} of an fp8kit layer (the
    fused layers' GEMM names; None for a Linear's one GEMM), {} for any
    other module."""
    from fp8kit.torch._fused_module import FusedLayer
    from fp8kit.torch.linear import Linear
    if isinstance(module, Linear):
        return {"weight": None}
    if isinstance(module, FusedLayer):
        return {weight: gemm for gemm, weight in module._GEMMS.items()}
    return {}


def _gemm_states(module: torch.nn.Module, gemm):
    """The RecipeStates of `module`'s GEMM `gemm`, looked up at each use (a
    checkpoint load replaces them)."""
    return module._fp8_states if gemm is None else module._fp8_states[gemm]


class FP8AllGatherWeight(torch.Tensor):
    """A high-precision weight whose FSDP2 all-gather moves FP8 bytes; `gemm`
    names the GEMM of its layer that reads it (None: a Linear's one GEMM).

    Every op runs on the wrapped tensor; views, copies and pieces of the
    parameter stay wrapped, with the same gemm (FSDP2 shards through them),
    in-place ops write the wrapped tensor, anything else gives plain
    tensors.
    """

    # Ops reach __torch_dispatch__ only; torch functions must not re-wrap
    # their plain results in this class.
    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, tensor: torch.Tensor, gemm=None):
        return torch.Tensor._make_wrapper_subclass(
            cls, tensor.shape, strides=tensor.stride(), storage_offset=tensor.storage_offset(),
            dtype=tensor.dtype, device=tensor.device, layout=tensor.layout,
            requires_grad=tensor.requires_grad)

    def __init__(self, tensor: torch.Tensor, gemm=None):
        self._tensor = tensor
        self._gemm = gemm

    def __repr__(self):
        gemm = "" if self._gemm is None else f", gemm={self._gemm!r}"
        return f"FP8AllGatherWeight({self._tensor!r}{gemm})"

    def __tensor_flatten__(self):
        return ["_tensor"], self._gemm

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return FP8AllGatherWeight(inner["_tensor"], meta)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        unwrap = (lambda t: t._tensor)
        out = func(*tree_map_only(FP8AllGatherWeight, unwrap, args),
                   **tree_map_only(FP8AllGatherWeight, unwrap, kwargs))
        first = func._schema.arguments[0] if func._schema.arguments else None
        if isinstance(out, torch.Tensor) and first is not None and \
                first.alias_info is not None and first.alias_info.is_write:
            return args[0]  # in place: the tensor written (the wrapper, for one of these)
        if func in _KEEPS_WRAPPER:
            gemm = next((a._gemm for a in args if isinstance(a, FP8AllGatherWeight)), None)
            return tree_map_only(torch.Tensor, lambda t: FP8AllGatherWeight(t, gemm), out)
        return out

    # --------------------------------------------------------- FSDP2 hooks
    def fsdp_pre_all_gather(self, mesh, outer_size, outer_stride, module, mp_policy):
        recipe = current_recipe()
        if recipe is None:
            recipe = _GATHER_RECIPE.get(module, DEFAULT_RECIPE)
        else:
            _GATHER_RECIPE[module] = recipe
        if isinstance(recipe, BlockScaling):
            raise TypeError(
                f"{_FN}: the layers' weights are all-gathered in per-tensor FP8, but "
                "BlockScaling quantizes each weight per 128x128 block itself. Run the model "
                "with DelayedScaling or CurrentScaling, or all-gather its weights in high "
                "precision (leave enable_fp8_all_gather out)")
        fp8 = recipe.fp8_format.forward_dtype
        shard = self._tensor
        padded_rows = -(-outer_size[0] // mesh.size())  # FSDP2's padded shard
        if shard.shape[0] != padded_rows:
            shard = F.pad(shard, (0, 0, 0, padded_rows - shard.shape[0]))
        group = mesh.get_group()
        state = _gemm_states(module, self._gemm).select(recipe, shard, False)[0]
        signature = _group.signature(sorted(state.recipe.items()))
        if isinstance(recipe, CurrentScaling):
            scale = _shared_current_scale(recipe, shard, group, signature)
            data, _, scale_inv = ops.quantize(shard, scale, fp8)
        else:
            data, scale_inv = _cast_delayed(module, self._gemm, state, recipe, shard, group,
                                            signature, fp8)
        return (data.view(torch.uint8),), (scale_inv, fp8)

    def fsdp_post_all_gather(self, all_gather_outputs, metadata, param_dtype, *, out=None):
        (gathered,) = all_gather_outputs
        scale_inv, fp8 = metadata
        _used_on_current_stream(scale_inv)
        data = gathered.view(_checks.TORCH_FP8[fp8])
        if out is not None:  # the same buffers, refilled: only the scale is new
            out._root()._scale_inv.copy_(scale_inv)
            return None
        weight = Float8Tensor._make(tuple(data.shape), param_dtype, data.device, data, None,
                                    scale_inv, fp8, None)
        return weight, (data,)


def _shared_current_scale(recipe, shard, group, signature) -> torch.Tensor:
    """The current-scaling scale of the whole weight: the core's rule
    (fp8kit.torch.quantize_current_scaling) applied to the max of the
    shards' amaxes."""
    amax = _group_amax(shard, group, signature)
    _, _, scale, _, _ = ops.quantize_current_scaling(
        amax.reshape(1), recipe.fp8_format.forward_dtype, True, False, recipe.amax_epsilon,
        recipe.power_2_scale)
    return scale


def _group_amax(shard, group, signature) -> torch.Tensor:
    """max |weight| over every shard (float32 [1]), with the recipe's
    signature checked in the same all-reduce."""
    buffer = torch.cat([signature.to(shard.device), ops.amax(shard).reshape(1).float()])
    buffer = torch.where(torch.isnan(buffer), torch.inf, buffer)
    dist.all_reduce(buffer, op=dist.ReduceOp.MAX, group=group)
    _group.check_signature("fp8kit.torch.distributed FP8 all-gather", buffer[:-1],
                           "fp8kit recipes")
    return buffer[-1:]


def _cast_delayed(module, gemm, state, recipe, shard, group, signature, fp8):
    """(FP8 shard, scale_inv) cast with the weight scale of `state` (the
    layer's state of GEMM `gemm`), the same on every rank."""
    history, _, scale, scale_inv, _, _ = state.tensors
    seeded = _SEEDED.setdefault(module, set())
    if state not in seeded:
        # A state that never recorded the weight (fresh, or loaded from a
        # checkpoint of a run that did not gather it) takes its first scale
        # from the whole weight, the same on every rank (the histories are
        # the same on every rank, so all of them make this all-reduce): the
        # scale the rule gives for that amax alone, as a fresh slot's first
        # cast in one process; the cast below records the amax.
        if not bool(history[_WEIGHT].any()):
            amax = _group_amax(shard, group, signature)
            ops.delayed_scaling_update([history[_WEIGHT].clone()], [amax],
                                       [scale[_WEIGHT:_WEIGHT + 1]],
                                       [scale_inv[_WEIGHT:_WEIGHT + 1]], [fp8],
                                       margin=recipe.margin,
                                       amax_reduction=recipe.amax_reduction.value)
        seeded.add(state)
    weight_scale = scale[_WEIGHT:_WEIGHT + 1].clone()
    shard_amax = torch.zeros(1, dtype=torch.float32, device=shard.device)
    data, _, weight_scale_inv = ops.quantize(shard, weight_scale, fp8, amax_out=shard_amax)
    # FSDP2 gathers under no_grad and may prefetch: the layer's forward
    # decides whether this amax is recorded (_record_weight_amax).
    _PENDING_AMAX.setdefault(module, {})[gemm] = (state, recipe, shard_amax)
    return data, weight_scale_inv


def _record_weight_amax(module, args, output) -> None:
    """Forward hook: a forward that computes gradients records the amax of
    each weight shard its all-gathers cast in that weight's history, leaving
    the scale (AmaxSync reduces the history across ranks and sets it)."""
    pending = _PENDING_AMAX.pop(module, {})
    if not (torch.is_grad_enabled() and output.requires_grad):
        return
    for state, recipe, shard_amax in pending.values():
        _used_on_current_stream(shard_amax)
        history, _, scale, scale_inv, _, _ = state.tensors
        ops.delayed_scaling_update([history[_WEIGHT]], [shard_amax],
                                   [scale[_WEIGHT:_WEIGHT + 1].clone()],
                                   [scale_inv[_WEIGHT:_WEIGHT + 1].clone()],
                                   [recipe.fp8_format.forward_dtype], margin=recipe.margin,
                                   amax_reduction=recipe.amax_reduction.value)


def _used_on_current_stream(t: torch.Tensor) -> None:
    """FSDP2 runs fsdp_pre_all_gather on its all-gather copy-in stream: a
    tensor made there and read here must not be reused by that stream's
    allocations before this stream's reads are done."""
    if t.is_cuda:
        t.record_stream(torch.cuda.current_stream(t.device))


def _plain_weights_in_state_dict(module, state_dict, prefix, local_metadata) -> None:
    """State-dict hook: the GEMM weights as plain tensors (DTensors of plain
    shards under FSDP2) sharing the parameters' storage, so checkpoints hold
    plain tensors (torch.load(weights_only=True) reads them) and loads write
    the parameters."""
    from torch.distributed.tensor import DTensor
    for name in _gemm_weights(module):
        key = prefix + name
        weight = state_dict.get(key)
        if isinstance(weight, FP8AllGatherWeight):
            state_dict[key] = weight._tensor
        elif isinstance(weight, DTensor):
            with torch.no_grad():
                local = weight.to_local()
                if isinstance(local, FP8AllGatherWeight):
                    state_dict[key] = DTensor.from_local(
                        local._tensor, weight.device_mesh, weight.placements, run_check=False,
                        shape=weight.shape, stride=weight.stride())


def enable_fp8_all_gather(module: torch.nn.Module) -> torch.nn.Module:
    """Wraps the GEMM weights of every fp8kit layer under `module` (Linear,
    LayerNormLinear, LayerNormMLP) in FP8AllGatherWeights (in place;
    returns `module`). Call it before fully_shard: FSDP2 reads a
    parameter's extension points when it shards it."""
    from torch.distributed.tensor import DTensor

    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"{_FN}: module must be a torch.nn.Module, got {type(module).__name__}")
    for name, m in module.named_modules():
        wrapped = False
        for weight_name, gemm in _gemm_weights(m).items():
            weight = getattr(m, weight_name)
            if isinstance(weight, DTensor):
                raise RuntimeError(
                    f"{_FN}: {name or 'the module'} is already sharded by fully_shard; FSDP2 "
                    "reads a parameter's all-gather hooks when it shards it, so call "
                    "enable_fp8_all_gather on the unsharded model, then fully_shard")
            if isinstance(weight, FP8AllGatherWeight):
                continue
            setattr(m, weight_name, torch.nn.Parameter(FP8AllGatherWeight(weight.data, gemm),
                                                       requires_grad=weight.requires_grad))
            wrapped = True
        if wrapped:
            m.register_forward_hook(_record_weight_amax)
            m.register_state_dict_post_hook(_plain_weights_in_state_dict)
    return module
