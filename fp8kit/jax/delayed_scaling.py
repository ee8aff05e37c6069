"""Delayed scaling: the per-layer state (DelayedScalingState), the fused
quantize-seed-record step the dense layer runs on it, and the standalone
amax-history update for many tensors in one custom call
(delayed_scaling_update).

The update rule is the core's (fp8kit/delayed_scaling.h): roll the newest
amax into the history (column 0 the newest), reduce it (max or most
recent), and set scale = fp8_max / amax_reduced / 2**margin unless that
amax is zero or not finite (then the previous scale is kept);
scale_inv = 1 / scale.

DelayedScalingState rows, one per slot of fp8kit/linear.h (the core's
fp8kit_linear_slot, the same names in fp8kit.torch):
    INPUT = 0        the input x              (forward format, E4M3)
    WEIGHT = 1       the kernel               (forward format, E4M3)
    GRAD_OUTPUT = 2  the output gradient dy   (backward format: E5M2 under HYBRID)
A layer of n Linears (num_linears; fp8kit.jax.layernorm_mlp has 2) has 3n
rows: the input and kernel of each Linear in order (forward format), then
the output gradient of each (backward format); layernorm_mlp's are listed
in fp8kit/jax/fused_mlp_layer.py.

amax_history[i, 0] is slot i's newest amax; scale[i] the scale its next
quantization uses; seeded[i] is 0.0 for a fresh slot and 1.0 once a
recorded quantization has seeded it (float32, not int: JAX gives integer
inputs no cotangent, and the state travels as one; see below).

The protocol (common/include/fp8kit/linear.h, the same in fp8kit.torch):
  - seeding: a fresh slot's first quantization takes its scale from the
    tensor's own amax, so step 0 is not cast with scale 1;
  - recording: in a differentiated call, x and the kernel are quantized
    and recorded (amax rolled into the history, scale recomputed) in one
    fused call in the forward, dy in one in the backward;
  - a call that is not differentiated casts with the state's scales (or
    the seed scale of a fresh slot) and leaves the state unchanged.

How the updated state leaves `dense` (the "state cotangent" convention):
the amax of dy exists only in the backward pass, so the updated state
leaves the only way a backward pass can return anything - as the
cotangent of the `state` argument. Differentiate the loss with respect to
the state as well as the parameters and use that "gradient" as the next
state:

    loss_and_grads = jax.value_and_grad(loss_fn, argnums=(0, 1))
    loss, (param_grads, new_state) = loss_and_grads(params, state, batch)
    state = new_state                      # not an optimizer step

Use each state in exactly one dense call per step (cotangents of a shared
input are summed). Under jax.vmap the state may be batched (in_axes=0: one
state per example, each updated by its example) or shared (in_axes=None:
the call acts as one call over the whole batch - every example cast with
the same scale, the state recorded once with the max of the examples'
amaxes; fp8kit/jax/_batching.py).

Checks (fp8kit/jax/_state_values.py): the layers check a state's fields'
shapes and dtypes on every call, and its values (amax_history >= 0, scale
finite and > 0, seeded 0 or 1) wherever they are concrete: at
DelayedScalingState.from_arrays and from_state_dict (a restore), at
fp8kit.models' checkpoint load, and at a layer call outside jit. Under jit
the values are tracers: a state restored or built from arrays is checked
where it enters, before the step. A second call on one state in one
differentiated function is an error while tracing.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp

from fp8kit import recipe as recipe_lib
from fp8kit.jax import _batching, _checks, _ffi, _state_values
from fp8kit.jax.scaled_tensor import ScaledTensor

INPUT, WEIGHT, GRAD_OUTPUT = _ffi.SLOT_INPUT, _ffi.SLOT_WEIGHT, _ffi.SLOT_GRAD_OUTPUT
NUM_SLOTS = _ffi.NUM_SLOTS


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DelayedScalingState:
    """amax_history: float32 [slots, amax_history_len]; scale: float32 [slots];
    seeded: float32 [slots] (0.0 fresh, 1.0 seeded); slots = 3 per Linear.

    The constructor checks nothing: JAX rebuilds the state from tracers
    and placeholders while it transforms a function. Make one with
    create(recipe), or from arrays with from_arrays (checked)."""

    amax_history: jax.Array
    scale: jax.Array
    seeded: jax.Array

    @classmethod
    def create(cls, recipe: recipe_lib.DelayedScaling,
               num_linears: int = 1) -> "DelayedScalingState":
        """Fresh state for a layer of `num_linears` Linears (dense and
        layernorm_dense: 1, layernorm_mlp: 2): empty history, scale 1,
        every slot unseeded (the first quantization of each slot seeds its
        scale from its amax)."""
        if not isinstance(recipe, recipe_lib.DelayedScaling):
            raise TypeError("DelayedScalingState.create: recipe must be an "
                            f"fp8kit.recipe.DelayedScaling, got {type(recipe).__name__}")
        # int_in refuses a bool, as the recipes do: True for a count is a mistake.
        num_linears = _checks.int_in(
            "DelayedScalingState.create", "num_linears (1: dense, layernorm_dense; 2: "
            "layernorm_mlp)", num_linears, 1, 2)
        slots = NUM_SLOTS * num_linears
        return cls(amax_history=jnp.zeros((slots, recipe.amax_history_len), jnp.float32),
                   scale=jnp.ones((slots,), jnp.float32),
                   seeded=jnp.zeros((slots,), jnp.float32))

    @classmethod
    def from_arrays(cls, amax_history, scale, seeded) -> "DelayedScalingState":
        """A state from its three arrays (kept as given, not copied),
        checked: float32, shapes [slots, amax_history_len], [slots], [slots]
        with 3 or 6 slots (1 or 2 Linears), and, where the values are
        concrete, the values (module docstring)."""
        return cls._checked("DelayedScalingState.from_arrays",
                            "pass the arrays of a state fp8kit made (create, or a layer's update)",
                            amax_history=amax_history, scale=scale, seeded=seeded)

    def to_state_dict(self) -> dict:
        """{"amax_history", "scale", "seeded": array}: what Flax's
        serialization writes (fp8kit.jax.flax registers it)."""
        return {name: getattr(self, name) for name in _state_values.FIELDS}

    def from_state_dict(self, state_dict: dict) -> "DelayedScalingState":
        """The state `state_dict` holds (to_state_dict's dict, as Flax
        restores it), for this state's place: the same shapes, checked as
        from_arrays checks."""
        fn = "DelayedScalingState.from_state_dict"
        _state_values.check_saved_state(fn, self, state_dict, "amax_history_len")
        return type(self)._checked(fn, "the checkpoint is corrupt (restore an earlier one)",
                                   **state_dict)

    @classmethod
    def _checked(cls, fn: str, fix: str, **arrays) -> "DelayedScalingState":
        """from_arrays' checks, errors naming `fn` and ending in `fix`."""
        _state_values.check_float32_arrays(fn, arrays)
        shapes = {name: tuple(arrays[name].shape) for name in _state_values.FIELDS}
        slots = shapes["scale"][0] if len(shapes["scale"]) == 1 else None
        if (slots not in (NUM_SLOTS, 2 * NUM_SLOTS) or shapes["seeded"] != (slots,)
                or len(shapes["amax_history"]) != 2 or shapes["amax_history"][0] != slots
                or not 1 <= shapes["amax_history"][1] <= _ffi.AMAX_HISTORY_LEN_MAX):
            raise ValueError(
                f"{fn}: amax_history, scale and seeded have shapes {tuple(shapes.values())}; a "
                f"state has [slots, amax_history_len], [slots] and [slots] with slots = 3 per "
                f"Linear (3 or 6) and 1 <= amax_history_len <= {_ffi.AMAX_HISTORY_LEN_MAX}")
        state = cls(**arrays)
        state.check_values(f"{fn}: ", fix)
        return state

    def check_values(self, where: str, fix: str) -> None:
        """A ValueError "{where}FIELD holds X (flat index i); FIELD values
        must be ...: {fix}" for the first value that breaks its field's
        rule (module docstring); nothing for a traced state."""
        if _state_values.is_concrete(self):
            bad = _state_values.first_bad_value(self, fix)
            if bad is not None:
                raise ValueError(f"{where}{bad}")

    @staticmethod
    def formats(recipe: recipe_lib.DelayedScaling, num_linears: int = 1) -> tuple[str, ...]:
        """FP8 format of each row under `recipe`: forward for the inputs and
        kernels, backward for the output gradients (the last num_linears)."""
        fmt = recipe.fp8_format
        return ((fmt.forward_dtype,) * (2 * num_linears)
                + (fmt.backward_dtype,) * num_linears)


def check_state(fn: str, recipe: recipe_lib.DelayedScaling, state,
                num_linears: int = 1) -> None:
    """state must be a DelayedScalingState whose fields are float32 arrays of
    the shapes `recipe` and the layer's `num_linears` need (checked before
    anything is lowered), and whose values, where concrete, are valid."""
    slots = NUM_SLOTS * num_linears
    create = ("DelayedScalingState.create(recipe)" if num_linears == 1 else
              f"DelayedScalingState.create(recipe, num_linears={num_linears})")
    if not isinstance(state, DelayedScalingState):
        raise TypeError(f"{fn}: a DelayedScaling recipe needs state={create}, got "
                        f"{type(state).__name__}")
    want = {"amax_history": (slots, recipe.amax_history_len),
            "scale": (slots,), "seeded": (slots,)}
    for name, shape in want.items():
        a = getattr(state, name)
        if not hasattr(a, "dtype") or not hasattr(a, "shape"):
            raise TypeError(f"{fn}: state.{name} is a {type(a).__name__}; it must be a float32 "
                            f"array of shape {shape}. Create the state with {create}.")
        if jnp.dtype(a.dtype) != jnp.float32:
            raise TypeError(f"{fn}: state.{name} has dtype {jnp.dtype(a.dtype)}; the state is "
                            f"float32 (seeded too: 0.0 fresh, 1.0 seeded). Pass "
                            f"state.{name}.astype(jnp.float32) or a fresh {create}.")
    shapes = tuple(tuple(getattr(state, name).shape) for name in want)
    if shapes != tuple(want.values()):
        raise ValueError(
            f"{fn}: state has amax_history, scale and seeded of shapes {shapes}; the recipe "
            f"needs ({slots}, {recipe.amax_history_len}), ({slots},) and ({slots},). Create it "
            f"with {create}.")
    state.check_values(f"{fn}: state.", f"start from a fresh {create} (the layers' updates "
                                         "never write such a value: it was edited or restored "
                                         "from a corrupt checkpoint)")


def note_use(fn: str, state) -> None:
    """Records a layer call on `state` (None: stateless) once its arguments
    are checked; a ValueError if the differentiation being traced has
    handed the state to another call already (_state_values.py)."""
    if state is not None:
        _state_values.USES.record(fn, state)


def quantize_and_record(state: DelayedScalingState, recipe: recipe_lib.DelayedScaling,
                        first_slot: int, tensors, copies, sums_dtypes, record: bool):
    """Quantize `tensors` (slots first_slot, first_slot + 1, ...) with their
    state in one fused call: seeded, and recorded when `record`.

    copies: (rowwise, columnwise) per tensor; sums_dtypes: the dtype of each
    tensor's column sums, or None. Returns (state, ScaledTensors, sums): the
    state with those slots updated (unchanged when not recording).
    """
    num_linears = state.scale.shape[-1] // NUM_SLOTS
    fmts = DelayedScalingState.formats(recipe, num_linears)[first_slot:first_slot + len(tensors)]
    call = _ffi.DelayedQuantize(
        fmts=fmts, copies=tuple((bool(r), bool(c)) for r, c in copies),
        sums_dtypes=tuple(None if d is None else jnp.dtype(d) for d in sums_dtypes),
        record=bool(record), margin=recipe.margin, amax_reduction=recipe.amax_reduction.value,
        first_slot=first_slot)
    # The whole state goes through the call, which updates its rows in place:
    # slicing rows out and scattering them back would cost XLA kernels of
    # their own around every call.
    history, scale, seeded, outputs = _batching.quantize_delayed_update(
        call, state.amax_history, state.scale, state.seeded, list(tensors))
    quantized, sums = [], []
    for i, ((data, columnwise_data, s, scale_inv), (rowwise, columnwise)) in enumerate(
            zip(outputs, call.copies)):
        quantized.append(ScaledTensor(
            data=data if rowwise else None, scale_inv=scale_inv,
            columnwise_data=columnwise_data if columnwise else None, fp8_dtype=fmts[i]))
        sums.append(s if call.sums_dtypes[i] is not None else None)
    if record:
        state = DelayedScalingState(amax_history=history, scale=scale, seeded=seeded)
    return state, quantized, sums


def delayed_scaling_update(amax_history, amax, scale, fp8_dtypes: Sequence, margin: int = 0,
                           amax_reduction=recipe_lib.AmaxReduction.MAX):
    """Update n tensors' scaling state at once.

    amax_history: float32 [n, amax_history_len]; amax: float32 [n] (the newest
    amaxes); scale: float32 [n] (the scales in use); fp8_dtypes: n formats
    ("e4m3"/"e5m2"). Returns (new_history, new_scale, new_scale_inv).
    """
    fn = "fp8kit.jax.delayed_scaling_update"
    amax_history, amax, scale = (jnp.asarray(a) for a in (amax_history, amax, scale))
    for name, a in (("amax_history", amax_history), ("amax", amax), ("scale", scale)):
        if a.dtype != jnp.float32:
            raise TypeError(f"{fn}: {name} has dtype {a.dtype}; scaling state is float32")
    if amax_history.ndim != 2 or amax_history.shape[1] < 1:
        raise ValueError(f"{fn}: amax_history must be [n, amax_history_len >= 1], got shape "
                         f"{amax_history.shape}")
    n = amax_history.shape[0]
    if amax.shape != (n,) or scale.shape != (n,):
        raise ValueError(f"{fn}: amax and scale must have shape ({n},) to match amax_history "
                         f"{amax_history.shape}; got {amax.shape} and {scale.shape}")
    _checks.int_in(fn, "amax_history.shape[1] (the history length)", amax_history.shape[1], 1,
                   _ffi.AMAX_HISTORY_LEN_MAX)
    if isinstance(fp8_dtypes, str) or not isinstance(fp8_dtypes, Sequence):
        raise TypeError(f"{fn}: fp8_dtypes={fp8_dtypes!r} must be a list of formats, one per "
                        "tensor, e.g. ['e4m3', 'e5m2']")
    fmts = [_checks.fp8_dtype(fn, f"fp8_dtypes[{i}]", f) for i, f in enumerate(fp8_dtypes)]
    if len(fmts) != n:
        raise ValueError(f"{fn}: fp8_dtypes lists {len(fmts)} formats for {n} tensors")
    margin = _checks.int_in(fn, "margin", margin, 0, _ffi.MARGIN_MAX)
    if not isinstance(amax_reduction, recipe_lib.AmaxReduction):
        raise TypeError(f"{fn}: amax_reduction must be an fp8kit.recipe.AmaxReduction, got "
                        f"{amax_reduction!r}")
    return _ffi.delayed_scaling_update_call(amax_history, amax, scale, fmts, margin,
                                            amax_reduction.value)
