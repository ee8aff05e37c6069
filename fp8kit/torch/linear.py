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

FP8 GEMMs need in_features and out_features to be multiples of the
extension's GEMM_DIM_MULTIPLE (cuBLASLt's FP8 alignment).

The extra state (format 2) holds plain values and tensors only: the
recipe's scaling parameters as a dict of str/int/float/bool, the
delayed-scaling history, scale and scale_inv, and which slots are seeded.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fp8kit.torch._ext import ext
from fp8kit.torch.autocast import STATE as _AUTOCAST

_linear_forward = ext.linear_forward
# 2: the recipe as a dict of named plain values (1 had a positional tuple
# and a flag for amaxes left waiting by an older update order).
_EXTRA_STATE_FORMAT = 2


class Linear(torch.nn.Linear):
    """torch.nn.Linear with FP8 GEMMs inside fp8kit.torch.autocast."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=None) -> None:
        super().__init__(in_features, out_features, bias, device, dtype)
        self._fp8_state = None    # ext.LinearState for the recipe in use
        self._fp8_recipe = None   # the recipe object last seen (fast identity check)
        self._fp8_cache_weight = False  # opt-in: see the module docstring

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        recipe = _AUTOCAST.recipe
        if recipe is None:
            return F.linear(input, self.weight, self.bias)
        if recipe is not self._fp8_recipe:
            self._fp8_use_recipe(recipe)
        # _parameters directly: the lookup self.weight makes through
        # Module.__getattr__ is a visible share of a small layer's call.
        params = self._parameters
        return _linear_forward(self._fp8_state, input, params["weight"], params["bias"])

    # ------------------------------------------------------------ FP8 state
    def _fp8_use_recipe(self, recipe) -> None:
        # The C++ state reads the recipe's fields itself (type-checked); a
        # recipe with other scaling parameters gets a fresh state.
        st = self._fp8_state
        if st is None or not st.use_recipe(recipe):
            st = ext.LinearState(recipe, self.weight.device)
            st.cache_weight = self._fp8_cache_weight
            self._fp8_state = st
        self._fp8_recipe = recipe

    @property
    def fp8_state(self):
        """The layer's ext.LinearState (None before its first FP8 forward)."""
        return self._fp8_state

    @property
    def cache_fp8_weight(self) -> bool:
        return self._fp8_cache_weight

    @cache_fp8_weight.setter
    def cache_fp8_weight(self, value: bool) -> None:
        self._fp8_cache_weight = bool(value)
        if self._fp8_state is not None:
            self._fp8_state.cache_weight = self._fp8_cache_weight

    def get_extra_state(self):
        if self._fp8_state is None:
            return {"format": _EXTRA_STATE_FORMAT}
        state = self._fp8_state.get_state()
        state["format"] = _EXTRA_STATE_FORMAT
        return state

    def set_extra_state(self, state) -> None:
        fmt = state.get("format") if isinstance(state, dict) else None
        if fmt != _EXTRA_STATE_FORMAT:
            raise ValueError(
                "fp8kit.torch.Linear: _extra_state is not an fp8kit Linear FP8 state of format "
                f"{_EXTRA_STATE_FORMAT} (got format {fmt!r}); it was written by another fp8kit "
                "version or another layer type. Drop its '_extra_state' entries to load the "
                "weights with a fresh FP8 state.")
        if "recipe" not in state:  # saved before any FP8 forward
            self._fp8_state = self._fp8_recipe = None
            return
        st = ext.LinearState.from_state(state, self.weight.device)
        st.cache_weight = self._fp8_cache_weight
        # The next forward keeps this state if its recipe has the same
        # scaling parameters (LinearState.use_recipe).
        self._fp8_state, self._fp8_recipe = st, None

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        # A torch.nn.Linear checkpoint has no FP8 state: start fresh.
        key = prefix + "_extra_state"
        if key in missing_keys:
            missing_keys.remove(key)

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        st = self._fp8_state
        if st is not None:
            if st.device != self.weight.device:
                st.to(self.weight.device)
            else:
                st.clear_weight_cache()
        return out

    # Pickling (torch.save(module), copy.deepcopy): the C++ state travels as
    # its extra state.
    def __getstate__(self):
        d = self.__dict__.copy()
        d["_fp8_saved"] = self.get_extra_state()
        d["_fp8_state"] = d["_fp8_recipe"] = None
        return d

    def __setstate__(self, d):
        saved = d.pop("_fp8_saved", None)
        super().__setstate__(d)
        if saved is not None:
            self.set_extra_state(saved)
