"""The fused steps of fp8kit.jax.layernorm_dense and layernorm_mlp: the
norm and the activation, each writing the next GEMM's FP8 operand in its
own pass (common/include/fp8kit/fused_cast.h), with the cast of the
Linear that reads it (its recipe, its state row, the copies its plan asks
for). Each returns what fp8kit.jax.dense's casts return: the state (as
passed when not recording or under current scaling), ScaledTensors, and
column sums; the custom calls are partitioned when a mesh is in context
(_sharding_fused.py). Under BlockScaling the norm and the activation run
without their cast, followed by a block cast (_fused_block_steps.py), and the
cast operands are padded to the block GEMM's token rows.

With high_precision (a layer recording its casts' statistics) each also
returns the values its cast read, shaped as the FP8 copy, for
_statistics_rows.record: the fused kernel's output in the input's dtype
(its optional result), or under BlockScaling the padded float32 values
the block cast read. Without it they are None and the fused kernels
write only the FP8 copies.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from fp8kit import recipe as recipe_lib
from fp8kit.jax import _checks
from fp8kit.jax import _ffi_fused as fused
from fp8kit.jax import _fused_block_steps as block
from fp8kit.jax import _mlp_fc1 as fc1_steps
from fp8kit.jax import _sharding as sh
from fp8kit.jax import _sharding_fused as shf
from fp8kit.jax._linear import LinearCall
from fp8kit.jax.delayed_scaling import DelayedScalingState
from fp8kit.jax.scaled_tensor import ScaledTensor


def _cast(lin: LinearCall, slot: int, fmt: str, copies, record: bool, high_precision: bool,
          sums_dtype=None) -> fused.FusedCast:
    r = lin.recipe
    if lin.delayed:
        return fused.FusedCast(fmt=fmt, copies=tuple(map(bool, copies)), delayed=True,
                               record=record, slot=slot, margin=r.margin,
                               amax_reduction=r.amax_reduction.value, sums_dtype=sums_dtype,
                               high_precision=high_precision)
    return fused.FusedCast(fmt=fmt, copies=tuple(map(bool, copies)), delayed=False,
                           amax_epsilon=r.amax_epsilon, power_2_scale=r.power_2_scale,
                           sums_dtype=sums_dtype, high_precision=high_precision)


def _state_in(state):
    return None if state is None else fused.DelayedState(state.amax_history, state.scale,
                                                         state.seeded)


def _state_out(result: fused.CastResult, state):
    if result.state is None:  # current scaling: stateless
        return state
    return DelayedScalingState(result.state.amax_history, result.state.scale,
                               result.state.seeded)


def _scaled(result: fused.CastResult, cast: fused.FusedCast) -> ScaledTensor:
    rowwise, columnwise = cast.copies
    return ScaledTensor(data=result.data if rowwise else None, scale_inv=result.scale_inv,
                        columnwise_data=result.columnwise_data if columnwise else None,
                        fp8_dtype=cast.fmt)


def norm_forward(lin: LinearCall, norm: str, epsilon: float, x, gamma, beta, state, copies,
                 record: bool, high_precision: bool):
    """The norm of x [rows, hidden] cast as `lin`'s input: (state,
    ScaledTensor, mean (LayerNorm) or None, rsigma, the values cast or
    None)."""
    if lin.block:
        ln, mean, rsigma, y = block.norm_forward(lin, norm, epsilon, x, gamma, beta, copies)
        return state, ln, mean, rsigma, y if high_precision else None
    cast = _cast(lin, lin.input_slot, lin.forward_dtype, copies, record, high_precision)
    result, mean, rsigma = shf.norm_forward(cast, _state_in(state), x, gamma, beta, norm,
                                            epsilon)
    return (_state_out(result, state), _scaled(result, cast),
            mean if norm == "layernorm" else None, rsigma, result.high_precision)


def norm_backward(norm: str, epsilon: float, dy, x, mean, rsigma, gamma, param_dtype):
    """(dx, dgamma, dbeta or None); dgamma and dbeta in param_dtype."""
    if mean is None:
        mean = jnp.zeros((0,), jnp.float32)
    return shf.norm_backward(dy, x, mean, rsigma, gamma, norm, epsilon, param_dtype)


def activation_forward(lin: LinearCall, activation: str, h, state, copies, record: bool,
                       high_precision: bool):
    """act(h) cast as `lin`'s input: (state, ScaledTensor, the values cast
    or None). h is [rows, F], [rows, 2F] or SwiGLU's paired [rows, 2, F]
    (_sharding_fused.py)."""
    if lin.block:
        aq, a = block.activation_forward(lin, activation, h, copies)
        return state, aq, a if high_precision else None
    cast = _cast(lin, lin.input_slot, lin.forward_dtype, copies, record, high_precision)
    result = shf.activation_forward(cast, _state_in(state), h, activation)
    return _state_out(result, state), _scaled(result, cast), result.high_precision


def activation_backward(lin: LinearCall, activation: str, d_a, h, state, copies,
                        high_precision: bool):
    """dh = d_a * act'(h) cast as `lin`'s output gradient (recorded), with
    `lin`'s bias gradient from the same pass: (state, dq, db, the values
    cast or None). dq is a ScaledTensor, or for SwiGLU's paired h
    [rows, 2, F] an _mlp_fc1.Pair (db is then [2, F]; the values cast are
    those of its whole, None under BlockScaling, which casts the halves).

    Column sums need two rows or more; a single row gets a zero row added
    (its dh is 0: it changes neither the amax nor the sums) and removed
    from the copies after the cast."""
    if lin.block:
        dq, db, dh = block.activation_backward(lin, activation, d_a, h, copies)
        return state, dq, db, dh if high_precision else None
    rows = h.shape[0]
    sums_dtype = lin.bias_dtype if lin.bias_dtype is not None and rows > 0 else None
    if sums_dtype is not None:
        copies = (copies[0], True)
    one_row = sums_dtype is not None and rows == 1
    if one_row:
        d_a, h = (jnp.pad(t, [(0, 1)] + [(0, 0)] * (t.ndim - 1)) for t in (d_a, h))
    cast = _cast(lin, lin.grad_slot, lin.backward_dtype, copies, True, high_precision,
                 sums_dtype)
    result = shf.activation_backward(cast, _state_in(state), d_a, h, activation)
    if one_row:  # the rows are the copies' first and last dims
        result = dataclasses.replace(
            result, data=result.data[:1] if cast.copies[0] else result.data,
            columnwise_data=result.columnwise_data[..., :1],
            high_precision=None if result.high_precision is None else result.high_precision[:1])
    if h.ndim == 3:
        rowwise, columnwise = cast.copies
        dq = fc1_steps.grad_pair(result.data if rowwise else None,
                                 result.columnwise_data if columnwise else None,
                                 result.scale_inv, cast.fmt, sh.explicit_spec(h))
    else:
        dq = _scaled(result, cast)
    if lin.bias_dtype is None:
        db = None
    elif rows == 0:  # no tokens: a zero gradient
        db = jnp.zeros(h.shape[1:], lin.bias_dtype)
    else:
        db = result.sums
    return _state_out(result, state), dq, db, result.high_precision


# --- what both fused layers check and carry ------------------------------------------------

NORMALIZATIONS = ("layernorm", "rmsnorm")


def check_norm_args(fn: str, x, gamma, beta, normalization, epsilon):
    """x [..., hidden] (2 to 8 dims), gamma [hidden], beta [hidden] for
    LayerNorm and None for RMSNorm, epsilon finite >= 0. Returns (x, gamma,
    beta, epsilon) as arrays and a float."""
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"{fn}: normalization={normalization!r}; use 'layernorm' or 'rmsnorm'")
    _checks.high_precision(fn, "x", x)
    x = jnp.asarray(x)
    if x.ndim < 2 or x.ndim > 8:
        raise ValueError(f"{fn}: x has shape {x.shape}; expected [..., hidden] with 2 to 8 dims")
    hidden = x.shape[-1]
    _checks.high_precision(fn, "gamma", gamma)
    gamma = jnp.asarray(gamma)
    if gamma.shape != (hidden,):
        raise ValueError(f"{fn}: gamma has shape {gamma.shape}; expected ({hidden},) (x's last "
                         "dimension)")
    if normalization == "rmsnorm":
        if beta is not None:
            raise ValueError(f"{fn}: RMSNorm has no beta; pass beta=None")
    else:
        if beta is None:
            raise ValueError(f"{fn}: LayerNorm needs beta [{hidden}]; pass an array (zeros for "
                             "none) or use normalization='rmsnorm'")
        _checks.high_precision(fn, "beta", beta)
        beta = jnp.asarray(beta)
        if beta.shape != (hidden,):
            raise ValueError(f"{fn}: beta has shape {beta.shape}; expected ({hidden},)")
    return x, gamma, beta, _checks.epsilon(fn, "epsilon", epsilon)


def refuse_vmapped_state(fn: str, recipe, *args) -> None:
    """Delayed scaling under jax.vmap is refused: the fused casts have no
    batching rule that records a shared state once (fp8kit.jax.dense's
    _batching.py does it for its casts), and per-example recording would
    sum the state's cotangents. The layers take x [..., hidden], so a batch
    folds into the token dimensions instead."""
    if isinstance(recipe, recipe_lib.DelayedScaling) and sh.is_batched(*args):
        raise NotImplementedError(
            f"{fn}: DelayedScaling under jax.vmap is not supported; pass the batch as leading "
            "dimensions of x ([batch, ..., hidden]: every token is one row of the layer) or "
            "use CurrentScaling")


def explicit_specs(*args):
    """The sharding type of each argument (a pytree of arrays or None) under
    Explicit mesh axes, else None: custom_vjp needs each cotangent typed as
    its primal, and the custom calls' results are typed replicated."""
    if sh.explicit_spec(jnp.zeros(())) is None:
        return None
    return tuple(jax.tree_util.tree_map(sh.explicit_spec, a) for a in args)


def retype_like(values, specs):
    """values (a tuple of pytrees) with the sharding types in specs (None:
    unchanged)."""
    if specs is None:
        return values
    return tuple(jax.tree_util.tree_map(sh.retype, v, s) if v is not None else None
                 for v, s in zip(values, specs))


def retype_rows(y, specs):
    """The layer's output typed with its rows sharded as x's (specs[0]) and
    its columns replicated (no Explicit axes: y as it is)."""
    if specs is None:
        return y
    return sh.retype(y, sh.spec_of([sh.spec_axes(specs[0], 0), ()]))
