"""What the fused layers (LayerNormLinear, LayerNormMLP) share: the
normalization's parameters and high-precision math, the FP8 scaling states
(one ext.LinearState per GEMM and recipe, as fp8kit.torch.Linear keeps
one per recipe), their checkpoint form, device moves and pickling, and the
dtype/device checks of a call.

Extra state (format 2; plain values and tensors only, so it loads with
torch.load(weights_only=True)):
    {"format": 2, "layer": "<class name>",
     "gemms": {"<gemm name>": [one LinearState.get_state() dict per recipe]}}
with the gemm names of the layer (LayerNormLinear: "linear"; LayerNormMLP:
"fc1", "fc2"). Loading checks every entry as fp8kit.torch.Linear's does,
and refuses a missing or an unknown one. Format 1, which also loads, had
Linear's entries of format 2 (scale_inv saved, seeded a list of bools).

eps: torch's meaning, with None (RMSNorm only, torch.nn.RMSNorm's default)
the machine epsilon of the computation type: float32's for float32,
bfloat16 and float16 inputs, float64's for float64 ones (from_unfused
keeps a torch.nn.RMSNorm's None).

A GEMM weight may be a Float8Tensor (what FSDP2's FP8 all-gather of
fp8kit.torch.distributed gives the layer): its FP8 copies go to the GEMMs
as they are (weight_args), as fp8kit.torch.Linear's do.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fp8kit.torch import _fused_steps
from fp8kit.torch._fp8_extra_state import FP8ExtraState, check_entries
from fp8kit.torch._fp8_weight import stand_in, untraceable
from fp8kit.torch._linear_states import RecipeStates
from fp8kit.torch._traced_linear import traced_state
from fp8kit.torch.float8_tensor import Float8Tensor
from fp8kit.torch.linear import _autocast_dtype, _autocast_to, _tracing

_EXTRA_STATE_FORMAT = 2
_READABLE_FORMATS = (1, 2)
NORMALIZATIONS = ("LayerNorm", "RMSNorm")
_any_autocast = torch._C._is_any_autocast_enabled
_FLOAT32_EPS = torch.finfo(torch.float32).eps


def check_normalization(cls: str, normalization, eps) -> None:
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"fp8kit.torch.{cls}: normalization is {normalization!r}; use "
                         "'LayerNorm' or 'RMSNorm'")
    if eps is None and normalization == "RMSNorm":  # torch.nn.RMSNorm's default
        return
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps < math.inf:
        raise ValueError(f"fp8kit.torch.{cls}: eps is {eps!r}; it must be a finite float >= 0 "
                         "(or None with RMSNorm: torch.nn.RMSNorm's default)")


def check_features(cls: str, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"fp8kit.torch.{cls}: {name} is {value!r}; it must be a positive int")


def weight_args(weight: torch.Tensor) -> tuple:
    """(weight, fp8_weight) as the Linear steps take them
    (fp8kit.torch._fused_steps): a Float8Tensor gives a plain stand-in for
    its shape and dtype and its (rowwise, columnwise, scale_inv) FP8 copies,
    which the GEMMs read as they are (its slot records nothing: its scale
    belongs to whoever cast it); any other weight itself and None."""
    if not isinstance(weight, Float8Tensor):
        return weight, None
    return stand_in(weight), (weight.rowwise_data, weight.columnwise_data, weight.scale_inv)


def _is_master(index: int, param, master: tuple) -> bool:
    """Whether params[index] is a float32 GEMM weight the FP8 casts read as
    it is (a master weight: see FusedLayer._fp8_inputs)."""
    return index in master and param is not None and param.dtype == torch.float32


def master_dtype(weight, x: torch.Tensor):
    """torch.float32 for a float32 master weight beside a 16-bit x (its
    gradient comes out of the wgrad GEMM in float32), else None (the
    gradient has x's dtype, the weight's too)."""
    if weight.dtype == torch.float32 and x.dtype != torch.float32 and not isinstance(
            weight, Float8Tensor):
        return torch.float32
    return None


def init_linear(weight: torch.nn.Parameter, bias) -> None:
    """torch.nn.Linear's initialization."""
    torch.nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        bound = 1 / math.sqrt(weight.shape[1]) if weight.shape[1] > 0 else 0
        torch.nn.init.uniform_(bias, -bound, bound)


def read_norm(cls: str, norm) -> tuple:
    """(normalization, eps, gamma, beta) of a torch.nn.LayerNorm / RMSNorm."""
    fn = f"fp8kit.torch.{cls}.from_unfused"
    if isinstance(norm, torch.nn.LayerNorm):
        kind, beta = "LayerNorm", norm.bias
    elif isinstance(norm, torch.nn.RMSNorm):
        kind, beta = "RMSNorm", None
    else:
        raise TypeError(f"{fn}: norm must be a torch.nn.LayerNorm or torch.nn.RMSNorm, got "
                        f"{type(norm).__name__}")
    if len(norm.normalized_shape) != 1 or norm.weight is None:
        raise ValueError(f"{fn}: norm must normalize one dimension with elementwise_affine=True "
                         f"(got normalized_shape={tuple(norm.normalized_shape)}, "
                         f"weight={'None' if norm.weight is None else 'set'})")
    if kind == "LayerNorm" and beta is None:
        beta = torch.zeros_like(norm.weight)
    # RMSNorm's eps=None stays None: its value depends on the input's dtype
    # at each call, and the layer follows torch's rule for it (_fp8_eps).
    return kind, norm.eps, norm.weight, beta


class FusedLayer(FP8ExtraState, torch.nn.Module):
    """Base of the fused layers: the norm's parameters (layer_norm_weight,
    layer_norm_bias for LayerNorm) and the per-GEMM FP8 states."""

    # {GEMM name: the name of its weight parameter}, in the GEMMs' order.
    _GEMMS: dict = {}
    # The layer's name, which its checkpoints and errors give: the name of
    # the class that defines _GEMMS (LayerNormLinear, LayerNormMLP), also for
    # a subclass (fully_shard makes the module an FSDP<name>, and a
    # checkpoint must load across the two).
    _LAYER: str = ""
    # fp8kit.torch.inspect's recorder while a logged step runs (set on the
    # instance by the handle, fp8kit.torch._cast_records); None otherwise.
    _fp8_inspect = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "_GEMMS" in cls.__dict__:
            cls._LAYER = cls.__name__

    def _init_norm(self, hidden: int, normalization: str, eps, device, dtype) -> None:
        self.normalization = normalization
        self.eps = None if eps is None else float(eps)
        kw = {"device": device, "dtype": dtype}
        self.layer_norm_weight = torch.nn.Parameter(torch.ones(hidden, **kw))
        if normalization == "LayerNorm":
            self.layer_norm_bias = torch.nn.Parameter(torch.zeros(hidden, **kw))
        else:
            self.register_parameter("layer_norm_bias", None)
        self._fp8_states = self._fresh_fp8_states()

    @property
    def _fp8_eps(self) -> float:
        """eps as the FP8 path's normalization kernels take it. They compute
        in float32, for which torch.nn.RMSNorm's eps=None means float32's
        machine epsilon (torch's rule for float32, bfloat16 and float16
        inputs, the ones the FP8 path takes)."""
        return _FLOAT32_EPS if self.eps is None else self.eps

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        """torch's normalization, outside fp8kit autocast."""
        shape = (x.shape[-1],)
        gamma, beta = self.layer_norm_weight, self.layer_norm_bias
        if self.normalization == "LayerNorm":
            return F.layer_norm(x, shape, gamma, beta, self.eps)
        return F.rms_norm(x, shape, gamma, self.eps)

    def _fp8_inputs(self, x: torch.Tensor, params: list, master: tuple = ()) -> tuple:
        """x and the parameters as the FP8 path takes them: in torch.autocast's
        dtype when it is on (as fp8kit.torch.Linear casts; a weight already
        in FP8 stays as it is, and so does a float32 GEMM weight whose index
        in params is in `master`: the per-tensor casts read it as it is), one
        dtype and device for all (RuntimeError / ValueError naming the fix
        otherwise), x with 16-byte aligned data (the fused kernels' vectors)."""
        cls = self._LAYER
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"fp8kit.torch.{cls}: input must be a torch.Tensor, got "
                            f"{type(x).__name__}")
        if _tracing() and any(isinstance(p, Float8Tensor) for p in params):
            raise untraceable(cls)
        if _any_autocast():
            # Each tensor cast once: x is the size of the activations.
            dtype = _autocast_dtype(x.device.type)
            params = [p if isinstance(p, Float8Tensor) or _is_master(i, p, master)
                      else _autocast_to(p, dtype) for i, p in enumerate(params)]
            x = _autocast_to(x, dtype)
        ref = params[0]
        for i, p in enumerate(params):
            if p is not None and p.dtype != x.dtype and not (
                    _is_master(i, p, master) and x.dtype in (torch.bfloat16, torch.float16)):
                raise RuntimeError(
                    f"fp8kit.torch.{cls}: input has dtype {x.dtype} but the layer's parameters "
                    f"have dtype {p.dtype}; convert the input (input.to({p.dtype})) or the layer "
                    f"(layer.to({x.dtype})), or run under torch.autocast")
        if x.device != ref.device:
            raise ValueError(f"fp8kit.torch.{cls}: input is on {x.device} but the layer is on "
                             f"{ref.device}; move the input (input.to({str(ref.device)!r})) or "
                             "the layer (layer.to(device))")
        if x.dim() < 1 or x.shape[-1] != ref.shape[-1]:
            raise ValueError(f"fp8kit.torch.{cls}: input has shape {list(x.shape)} but the "
                             f"layer's hidden size is {ref.shape[-1]}; the last dimension of "
                             "input must equal it")
        x = x.reshape(-1, x.shape[-1])
        # A traced x has no data yet: its op aligns it (or names the fix).
        if not _tracing() and x.data_ptr() % 16:
            x = x.clone()
        return x, params

    def _select_states(self, recipe, weights) -> tuple:
        """(the steps table, one state per GEMM, forward_fast_accumulation)
        for `recipe`: the pybind11 calls and ext.LinearStates in eager mode,
        the dispatcher ops and TracedStates while torch.compile or
        torch.export traces (fp8kit.torch._fused_steps)."""
        tracing = _tracing()
        if tracing and self._fp8_inspect is not None:
            self._fp8_inspect.refuse_tracing()
        select = traced_state if tracing else RecipeStates.select
        fast = False
        states = []
        for g, w in zip(self._GEMMS, weights):
            st, fast = select(self._fp8_states[g], recipe, w, False)
            states.append(st)
        return (_fused_steps.TRACED if tracing else _fused_steps.EAGER), tuple(states), fast

    # ------------------------------------------------------------ FP8 state
    def fp8_state_for(self, recipe):
        """The LinearStates (one per GEMM, in _GEMMS order) `recipe` runs
        with, or None before its first use."""
        states = tuple(self._fp8_states[g].get(recipe) for g in self._GEMMS)
        return None if any(s is None for s in states) else states

    @property
    def fp8_states(self) -> dict:
        """{gemm name: every recipe's LinearState, in the order first used}."""
        return {g: self._fp8_states[g].all() for g in self._GEMMS}

    def get_extra_state(self):
        return {"format": _EXTRA_STATE_FORMAT, "layer": self._LAYER,
                "gemms": {g: [st.get_state() for st in self._fp8_states[g].all()]
                          for g in self._GEMMS}}

    def set_extra_state(self, state) -> None:
        cls = self._LAYER
        where = f"fp8kit.torch.{cls}: " + (getattr(self, "_fp8_loading", None) or "_extra_state")
        ok = (isinstance(state, dict) and state.get("format") in _READABLE_FORMATS
              and state.get("layer") == cls and isinstance(state.get("gemms"), dict))
        if not ok:
            raise ValueError(
                f"{where} is not an fp8kit {cls} FP8 state of format {_EXTRA_STATE_FORMAT}; it "
                "was written by another fp8kit version or another layer type. Drop its "
                "'_extra_state' entries to load the weights with a fresh FP8 state.")
        check_entries(state, ("format", "layer", "gemms"), where)
        check_entries(state["gemms"], tuple(self._GEMMS), f"{where}['gemms']")
        device = self.layer_norm_weight.device
        self._fp8_states = {
            g: RecipeStates.from_checkpoint(state["gemms"][g], device, False,
                                            f"{where}['gemms'][{g!r}]")
            for g in self._GEMMS}

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        device = self.layer_norm_weight.device
        for g in self._GEMMS:
            for st in self._fp8_states[g].all():
                if st.device != device:
                    st.to(device)
        return out

    def _fresh_fp8_states(self):
        return {g: RecipeStates() for g in self._GEMMS}

    def _states_by_gemm(self) -> dict:
        return self._fp8_states

    def _fp8_device(self):
        return self.layer_norm_weight.device
