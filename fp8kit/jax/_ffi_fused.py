"""The custom calls of the fused ops: LayerNorm/RMSNorm and GELU/SwiGLU
with the FP8 cast of their outputs fused in (common/include/fp8kit/
normalization.h, activation.h, fused_cast.h), one `*_call` per op on one
device's buffers, like _ffi.py (no argument checks, no sharding).

Each op that casts has one FFI target per recipe (jax_ext/fused_cast_ffi.h):
  *_delayed_update  delayed scaling, recording: the layer's whole state in
                    and out (aliased), row `slot` used;
  *_delayed         delayed scaling, read only: no state results;
  *_current         current scaling: scale and amax are results.
A `FusedCast` says which, and every call returns its cast's results as a
`CastResult`, so the layers read one shape whatever the recipe. With
`high_precision` a call also returns the values its cast read, in the
input's dtype (the C API's y, a or dh: one more result, last), for the
statistics of that cast; without it the target has no such result, so a
call without statistics allocates and writes nothing more.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from fp8kit.jax import _ffi

F32 = jnp.float32
NORM_CODES = {"layernorm": 0, "rmsnorm": 1}      # fp8kit_norm_type
ACTIVATION_CODES = {"gelu": 0, "swiglu": 1}      # fp8kit_activation


@dataclasses.dataclass(frozen=True)
class FusedCast:
    """Static description of a fused op's FP8 cast.

    delayed: the recipe (else current scaling). record: a recording pass
    (delayed only). slot: the state row. copies: (rowwise, columnwise).
    sums_dtype: the column sums of the values cast (activation backward).
    high_precision: also return the values cast, in the input's dtype."""

    fmt: str
    copies: tuple[bool, bool]
    delayed: bool
    record: bool = False
    slot: int = 0
    margin: int = 0
    amax_reduction: str = "max"
    amax_epsilon: float = 0.0
    power_2_scale: bool = False
    sums_dtype: Optional[jnp.dtype] = None
    high_precision: bool = False

    def attrs(self) -> dict:
        rowwise, columnwise = self.copies
        a = dict(rowwise=bool(rowwise), columnwise=bool(columnwise))
        if self.delayed:
            a.update(slot=np.int64(self.slot), margin=np.int32(self.margin),
                     amax_reduction=np.int32(_ffi.AMAX_REDUCTION_CODES[self.amax_reduction]))
        else:
            a.update(amax_epsilon=np.float32(self.amax_epsilon),
                     power_2_scale=bool(self.power_2_scale))
        return a

    def target(self, op: str) -> str:
        if not self.delayed:
            return f"fp8kit_{op}_current"
        return f"fp8kit_{op}_delayed_update" if self.record else f"fp8kit_{op}_delayed"


@dataclasses.dataclass(frozen=True)
class DelayedState:
    """A layer's whole delayed-scaling state as the calls take it."""

    amax_history: jax.Array
    scale: jax.Array
    seeded: jax.Array


@dataclasses.dataclass(frozen=True)
class CastResult:
    """What a fused cast leaves: the FP8 copies (placeholders where not
    asked for), scale_inv (1 / the scale used), the state (delayed: updated
    when recording, else as passed; None under current scaling), the amax
    of the values cast (current scaling only), the column sums and the
    values cast in the input's dtype (FusedCast.high_precision)."""

    data: jax.Array
    columnwise_data: jax.Array
    scale_inv: jax.Array
    state: Optional[DelayedState]
    amax: Optional[jax.Array] = None
    sums: Optional[jax.Array] = None
    high_precision: Optional[jax.Array] = None


def _cast_call(op: str, cast: FusedCast, state: Optional[DelayedState], amax, operands,
               v: jax.ShapeDtypeStruct, extra_results, attrs, with_sums: bool):
    """One fused target casting v (its shape, and the input's dtype): the
    cast's operands and results around the op's own (`operands` in,
    `extra_results` out). Returns (CastResult, extras)."""
    data, columnwise = _ffi.fp8_results(v.shape, cast.fmt, *cast.copies)
    high_precision = (v,) if cast.high_precision else ()
    sums = [_ffi.sums_result(v.shape, cast.sums_dtype)] if with_sums else []
    workspace = _ffi.workspace_result([(v.shape, cast.sums_dtype is not None)], cast.delayed)
    scalar = _ffi.F32_SCALAR
    if cast.delayed:
        state_results = ((jax.ShapeDtypeStruct(state.amax_history.shape, F32),
                          jax.ShapeDtypeStruct(state.scale.shape, F32),
                          jax.ShapeDtypeStruct(state.seeded.shape, F32)) if cast.record else ())
        results = (*state_results, workspace, data, columnwise, *sums, scalar, *extra_results,
                   *high_precision)
        args = (state.amax_history, state.scale, state.seeded,
                _ffi.placeholder(F32) if amax is None else jnp.reshape(amax, (1,)), *operands)
        aliases = {0: 0, 1: 1, 2: 2} if cast.record else {}
    else:
        state_results = ()
        results = ((workspace,) if with_sums else ()) + (data, columnwise, *sums, scalar, scalar,
                                                         scalar, *extra_results, *high_precision)
        args, aliases = tuple(operands), {}
    out = list(jax.ffi.ffi_call(cast.target(op), results, vmap_method="sequential",
                                input_output_aliases=aliases)(*args, **cast.attrs(), **attrs))
    hp = out.pop() if cast.high_precision else None
    if cast.delayed:
        new_state = DelayedState(*out[:3]) if cast.record else state
        out = out[len(state_results) + 1:]  # past the state and the workspace
        d, c, *rest = out
        s = rest.pop(0) if with_sums else None
        scale_inv, *extras = rest
        return CastResult(d, c, scale_inv, new_state, None, s, hp), extras
    if with_sums:
        out = out[1:]
    d, c, *rest = out
    s = rest.pop(0) if with_sums else None
    _, scale_inv, amax_out, *extras = rest
    return CastResult(d, c, scale_inv, None, amax_out, s, hp), extras


# --- normalization --------------------------------------------------------------------

def norm_forward_call(cast: FusedCast, state: Optional[DelayedState], x, gamma, beta,
                      norm: str, epsilon: float, amax=None):
    """fp8kit_norm_forward on x [rows, hidden]: (CastResult of y's FP8
    copies (and of y, cast.high_precision), mean [rows] (LayerNorm; else a
    placeholder), rsigma [rows]).
    amax: the global amax of y (sharded rows) to start the delayed cast at."""
    rows = x.shape[0]
    layernorm = norm == "layernorm"
    stats = (jax.ShapeDtypeStruct((rows,) if layernorm else _ffi.PLACEHOLDER, F32),
             jax.ShapeDtypeStruct((rows,), F32))
    result, (mean, rsigma) = _cast_call(
        "norm_forward", cast, state, amax,
        (x, gamma, beta if layernorm else _ffi.placeholder(x.dtype)),
        jax.ShapeDtypeStruct(x.shape, x.dtype), stats,
        dict(norm_type=np.int32(NORM_CODES[norm]), epsilon=np.float32(epsilon)), False)
    return result, mean, rsigma


def norm_backward_call(dy, x, mean, rsigma, gamma, norm: str, epsilon: float, param_dtype):
    """fp8kit_norm_backward: (dx, dgamma, dbeta (RMSNorm: None)); dgamma and
    dbeta in param_dtype."""
    rows, hidden = x.shape
    layernorm = norm == "layernorm"
    workspace = int(_ffi.ext.norm_backward_workspace(rows, hidden))
    dx, dgamma, dbeta, _ = jax.ffi.ffi_call(
        "fp8kit_norm_backward",
        (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct((hidden,), param_dtype),
         jax.ShapeDtypeStruct((hidden,) if layernorm else _ffi.PLACEHOLDER, param_dtype),
         jax.ShapeDtypeStruct((workspace,), F32)),
        vmap_method="sequential",
    )(dy, x, mean, rsigma, gamma, norm_type=np.int32(NORM_CODES[norm]),
      epsilon=np.float32(epsilon))
    return dx, dgamma, (dbeta if layernorm else None)


# --- activation ------------------------------------------------------------------------

def activated_shape(h_shape, activation: str) -> tuple[int, ...]:
    """a's shape: h's, with SwiGLU's [gate | up] halved."""
    last = h_shape[-1] // 2 if activation == "swiglu" else h_shape[-1]
    return (*h_shape[:-1], last)


def activation_forward_call(cast: FusedCast, state: Optional[DelayedState], h,
                            activation: str, amax=None) -> CastResult:
    """fp8kit_activation_forward: the FP8 copies of a = act(h) (and a,
    cast.high_precision)."""
    result, _ = _cast_call("activation_forward", cast, state, amax, (h,),
                           jax.ShapeDtypeStruct(activated_shape(h.shape, activation), h.dtype), (),
                           dict(activation=np.int32(ACTIVATION_CODES[activation])), False)
    return result


def activation_backward_call(cast: FusedCast, state: Optional[DelayedState], d_a, h,
                             activation: str, amax=None) -> CastResult:
    """fp8kit_activation_backward: the FP8 copies of dh = d_a * act'(h), and
    their column sums when cast.sums_dtype is set (recording target only
    under delayed scaling: the backward always records); dh itself with
    cast.high_precision."""
    result, _ = _cast_call("activation_backward", cast, state, amax, (d_a, h),
                           jax.ShapeDtypeStruct(h.shape, h.dtype), (),
                           dict(activation=np.int32(ACTIVATION_CODES[activation]),
                                sums=cast.sums_dtype is not None), True)
    return result


# --- without a cast (block scaling's layers) --------------------------------------------

def norm_forward_values_call(x, gamma, beta, norm: str, epsilon: float):
    """fp8kit_norm_forward_values on x [rows, hidden]: (y in x's dtype,
    mean [rows] (LayerNorm; else a placeholder), rsigma [rows])."""
    rows = x.shape[0]
    layernorm = norm == "layernorm"
    return tuple(jax.ffi.ffi_call(
        "fp8kit_norm_forward_values",
        (jax.ShapeDtypeStruct(x.shape, x.dtype),
         jax.ShapeDtypeStruct((rows,) if layernorm else _ffi.PLACEHOLDER, F32),
         jax.ShapeDtypeStruct((rows,), F32)),
        vmap_method="sequential",
    )(x, gamma, beta if layernorm else _ffi.placeholder(x.dtype),
      norm_type=np.int32(NORM_CODES[norm]), epsilon=np.float32(epsilon)))


def activation_forward_values_call(h, activation: str):
    """fp8kit_activation_forward_values: a = act(h) in h's dtype."""
    return jax.ffi.ffi_call(
        "fp8kit_activation_forward_values",
        jax.ShapeDtypeStruct(activated_shape(h.shape, activation), h.dtype),
        vmap_method="sequential",
    )(h, activation=np.int32(ACTIVATION_CODES[activation]))


def activation_backward_values_call(d_a, h, activation: str):
    """fp8kit_activation_backward_values: dh = d_a * act'(h) in h's dtype."""
    return jax.ffi.ffi_call(
        "fp8kit_activation_backward_values", jax.ShapeDtypeStruct(h.shape, h.dtype),
        vmap_method="sequential",
    )(d_a, h, activation=np.int32(ACTIVATION_CODES[activation]))
