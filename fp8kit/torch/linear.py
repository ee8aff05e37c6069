"""fp8kit.torch.Linear: a drop-in torch.nn.Linear whose GEMMs run in FP8
inside fp8kit.torch.autocast.

Same constructor, parameters (weight, bias), initialization and state_dict
keys as torch.nn.Linear, plus `_extra_state` holding the FP8 scaling state
(delayed-scaling histories, amaxes, scales), so a run resumed from a
checkpoint continues with exactly the scales it stopped with. Plain
nn.Linear checkpoints load too (the FP8 state then starts fresh).

Inside autocast, forward is one call into C++ (torch_ext/linear.h): it
quantizes the input and the weight, runs the FP8 GEMM with the bias
epilogue and records a C++ autograd node whose backward quantizes the
output gradient and runs the dgrad and wgrad GEMMs in FP8 (all three with
FP32-promoted accumulation unless the recipe's forward_fast_accumulation
asks for the forward GEMM's fast accumulation). Activations are
saved for backward in FP8. The weight is quantized on every forward by
default. `layer.cache_fp8_weight = True` reuses the quantized weight while
the weight tensor is unchanged (same tensor, storage and version counter,
which every in-place update through PyTorch bumps): worth it for gradient
accumulation and inference. It is opt-in because a write through
`weight.data` does not bump the version counter, and a cached FP8 weight
would then silently be stale.

Scaling state follows the layer protocol (common/include/fp8kit/linear.h):
a forward that computes gradients records the input's and the weight's
amaxes (and its backward the output gradient's); a forward that computes
none (torch.no_grad, inference_mode, nothing requiring grad) casts with
the current scales and leaves the state unchanged. A fresh delayed-scaling
slot takes its first scale from the tensor's own amax.

The layer keeps one scaling state per recipe it has run under (recipes
that differ only in forward_fast_accumulation share one), so switching
recipes, or running one layer from several threads under different
recipes, never discards or mixes up recorded state: each call picks the
state of its own thread's recipe and uses that one throughout.

Under torch.compile and torch.export forward goes through
the dispatcher ops torch.ops.fp8kit.linear_forward / linear_backward instead
(fp8kit.torch._traced_linear): the same C++ steps and bits, traced forward
and backward with no graph break, the scaling state updated in the graph.

As torch.nn.Linear, the input, the weight and the bias must have one dtype
(RuntimeError otherwise); under torch.autocast the input and the bias are
cast to its dtype first, as torch.nn.Linear's are, and so is the weight
under BlockScaling, while the per-tensor recipes cast a float32 weight (the
master weight) to FP8 as it is: one rounding instead of two, and no bf16
copy of the weight each step. The output has the autocast dtype and the
weight's gradient float32 either way. (A weight cast to the autocast dtype
is a new tensor each call, so cache_fp8_weight does not apply there.)

FP8 GEMMs need in_features and out_features to be multiples of the
extension's GEMM_DIM_MULTIPLE (cuBLASLt's FP8 alignment).

Under BlockScaling (a scale per 1x128 tile of the input and the output
gradient, per 128x128 block of the weight) forward and backward go through
fp8kit.torch._block_linear instead: an autograd.Function over the C++
block-scaled Linear's two dispatcher ops (the fused layers' GEMMs run the
same), with no scaling state (each block's scale is its own amax's), so
the layer's extra state gains nothing from it. cache_fp8_weight does not
apply there.

A weight that is already a Float8Tensor (what FSDP2's FP8 all-gather of
fp8kit.torch.distributed gives the layer) is read as it is: its FP8 copies
go to the GEMMs, its gradient reaches it as a plain tensor, and the
weight's scaling slot records nothing (fp8kit.torch._fp8_weight).

The extra state (format 3) holds plain values and tensors only, so it
loads with torch.load(weights_only=True): {"format": 3, "states": [...]},
one entry per recipe, each with the recipe's scaling parameters as a dict
of str/int/float/bool and the delayed-scaling state's three float32
arrays, amax_history, scale and seeded (those of fp8kit.jax's
DelayedScalingState; fp8_state_arrays gives them as NumPy arrays). Loading checks every entry and names a
missing, mistyped or corrupt one.

An inf or NaN in the input or a weight is never saturated: the outputs it
reaches are non-finite, as in bf16 (fp8kit.recipe says how the scales treat
it).

At a logged step of fp8kit.torch.inspect the layer holds a recorder, and
the same C++ call (and its backward) also writes the statistics of its
three casts, from the FP8 copies it made, into the recorder's buffer;
nothing else changes. Otherwise that recorder is None, checked once a call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fp8kit.recipe import BlockScaling
from fp8kit.torch._block_linear import block_linear
from fp8kit.torch._ext import ext
from fp8kit.torch._fp8_extra_state import FP8ExtraState, check_entries
from fp8kit.torch._fp8_weight import linear_with_fp8_weight
from fp8kit.torch._linear_states import RecipeStates
from fp8kit.torch._traced_linear import traced_linear
from fp8kit.torch.autocast import STATE as _AUTOCAST
from fp8kit.torch.float8_tensor import Float8Tensor
from fp8kit.torch.quantized_tensor import QuantizedTensor

_linear_forward = ext.linear_forward
# 3: {"states": [one dict per recipe]}, each recipe a dict of named plain
# values and the state's three float32 arrays (amax_history, scale,
# seeded: fp8kit.jax's). 2, which also loads, saved scale_inv and seeded
# as a list of bools; 1 had a positional tuple and a flag for amaxes left
# waiting by an older update order.
_EXTRA_STATE_FORMAT = 3
_READABLE_FORMATS = (2, 3)
# Whether any torch.autocast is on: a fast test before the per-device one
# (torch.is_autocast_enabled(device) costs ~1 us a call).
_any_autocast = torch._C._is_any_autocast_enabled
# False in eager mode, True while torch.compile or torch.export (strict or
# not) traces: the dispatcher ops trace, the pybind11 calls do not.
_tracing = torch.compiler.is_compiling


class Linear(FP8ExtraState, torch.nn.Linear):
    """torch.nn.Linear with FP8 GEMMs inside fp8kit.torch.autocast."""

    # fp8kit.torch.inspect's recorder while a logged step runs (set on the
    # instance by the handle, fp8kit.torch._cast_records); None otherwise.
    _fp8_inspect = None

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=None) -> None:
        super().__init__(in_features, out_features, bias, device, dtype)
        self._fp8_states = self._fresh_fp8_states()
        self._fp8_cache_weight = False  # opt-in: see the module docstring

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        recipe = _AUTOCAST.recipe
        if recipe is None:
            return F.linear(input, self.weight, self.bias)
        # _parameters directly: the lookup self.weight makes through
        # Module.__getattr__ is a visible share of a small layer's call.
        params = self._parameters
        weight, bias = params["weight"], params["bias"]
        if type(recipe) is BlockScaling:
            return self._block_forward(recipe, input, weight, bias)
        if isinstance(weight, Float8Tensor):  # already FP8 (an FSDP2 FP8 all-gather)
            if _any_autocast() and isinstance(input, torch.Tensor):
                input, _, bias = _autocast_cast(input, None, bias)
            return linear_with_fp8_weight(self._fp8_states, recipe, input, weight, bias,
                                          self._fp8_cache_weight, self._fp8_inspect)
        if _any_autocast() and isinstance(input, torch.Tensor):
            input, weight, bias = _autocast_cast(input, weight, bias, master_weight=True)
        inspect = self._fp8_inspect
        if _tracing():  # dispatcher ops trace, the pybind11 call does not
            if inspect is not None:
                inspect.refuse_tracing()
            return traced_linear(self._fp8_states, recipe, input, weight, bias,
                                 self._fp8_cache_weight)
        # One selection per call, held in locals: another thread switching
        # this layer to another recipe cannot change the state this call uses.
        state, fast = self._fp8_states.select(recipe, weight, self._fp8_cache_weight)
        if inspect is None:
            return _linear_forward(state, input, weight, bias, fast)
        # A logged step: the same call also writes its casts' statistics,
        # from its own FP8 copies, into the recorder's buffer.
        statistics = inspect.linear_statistics("", input.numel() // weight.shape[1], weight)
        return _linear_forward(state, input, weight, bias, fast, None, statistics)

    def _block_forward(self, recipe, input, weight, bias):
        if (_any_autocast() and isinstance(input, torch.Tensor)
                and not isinstance(weight, QuantizedTensor)):  # block_linear refuses that one
            input, weight, bias = _autocast_cast(input, weight, bias)
        return block_linear("Linear", recipe, input, weight, bias, self._fp8_inspect)

    # ------------------------------------------------------------ FP8 state
    @property
    def fp8_state(self):
        """The ext.LinearState this layer used (or loaded) last, None before
        its first FP8 forward; fp8_state_for(recipe) names one recipe's."""
        return self._fp8_states.latest()

    @property
    def fp8_states(self):
        """Every recipe's ext.LinearState, in the order first used (or loaded)."""
        return self._fp8_states.all()

    def fp8_state_for(self, recipe):
        """The ext.LinearState `recipe` runs with, or None before its first use
        (always None for BlockScaling, which keeps no state)."""
        return self._fp8_states.get(recipe)

    @property
    def cache_fp8_weight(self) -> bool:
        return self._fp8_cache_weight

    @cache_fp8_weight.setter
    def cache_fp8_weight(self, value: bool) -> None:
        self._fp8_cache_weight = bool(value)
        for st in self._fp8_states.all():
            st.cache_weight = self._fp8_cache_weight

    def get_extra_state(self):
        return {"format": _EXTRA_STATE_FORMAT,
                "states": [st.get_state() for st in self._fp8_states.all()]}

    def set_extra_state(self, state) -> None:
        where = getattr(self, "_fp8_loading", None) or "_extra_state"
        fmt = state.get("format") if isinstance(state, dict) else None
        if fmt not in _READABLE_FORMATS:
            raise ValueError(
                f"fp8kit.torch.Linear: {where} is not an fp8kit Linear FP8 state of format "
                f"{_EXTRA_STATE_FORMAT} (got format {fmt!r}); it was written by another fp8kit "
                "version or another layer type. Drop its '_extra_state' entries to load the "
                "weights with a fresh FP8 state.")
        where = f"fp8kit.torch.Linear: {where}"
        check_entries(state, ("format", "states"), where)
        self._fp8_states = RecipeStates.from_checkpoint(
            state["states"], self.weight.device, self._fp8_cache_weight, f"{where}['states']")

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        for st in self._fp8_states.all():
            if st.device != self.weight.device:
                st.to(self.weight.device)
            else:
                st.clear_weight_cache()
        return out

    def _fresh_fp8_states(self):
        return RecipeStates()

    def _states_by_gemm(self) -> dict:
        return {"linear": self._fp8_states}

    def _fp8_device(self):
        return self.weight.device


def _autocast_dtype(device_type: str):
    """torch.autocast's dtype on this device type, or None where it is off."""
    # fp8kit runs on these (torch.is_autocast_enabled raises for some others).
    if device_type not in ("cpu", "cuda") or not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


def _autocast_to(t, dtype):
    """t as torch.autocast computes with it: floating tensors other than
    float64 in `dtype` (None: autocast is off, t as it is)."""
    if dtype is None or t is None or t.dtype in (dtype, torch.float64) or not t.is_floating_point():
        return t
    return t.to(dtype)


def _autocast_cast(input, weight, bias, master_weight=False):
    """input, weight and bias in torch.autocast's dtype, as torch.nn.Linear
    computes under it. master_weight: a float32 weight stays float32 (the
    per-tensor FP8 cast reads it as it is: one rounding, and no bf16 copy of
    the weight each step; the output still has the autocast dtype)."""
    dtype = _autocast_dtype(input.device.type)
    keep = master_weight and weight is not None and weight.dtype == torch.float32
    return (_autocast_to(input, dtype), weight if keep else _autocast_to(weight, dtype),
            _autocast_to(bias, dtype))
