"""fp8kit.jax.dense: an FP8 dense layer (y = x @ kernel + bias) as a pure
function with a custom VJP, obeying the Linear layer protocol of
common/include/fp8kit/linear.h (the same bits as fp8kit.torch.Linear).

Forward:  y  = Q(x) @ Q(kernel)                    E4M3 x E4M3 -> x.dtype
Backward: dx = Q(dy) @ Q(kernel)^T                 (E5M2 under HYBRID) -> x.dtype
          dk = Q(x)^T @ Q(dy)                      -> kernel.dtype
          db = column sums of dy                   (from dy's cast, bias.dtype)
Every GEMM is an fp8kit custom call on FP8 data (no dequantize-then-dot).
Q is the recipe's quantizer: CurrentScaling quantizes each tensor with a
scale from its own amax (stateless); DelayedScaling seeds, casts and
records through the state (fp8kit/jax/delayed_scaling.py says how, and
how the updated state leaves as the state's cotangent).

Which copies (rowwise, columnwise) each cast writes and what the forward
keeps for backward is the core's plan (fp8kit_linear_plan_make), asked
once per traced shape: no copy of that rule lives here.

Shapes: x [..., K], kernel [K, N], bias [N]; K and N positive multiples of
the core's GEMM_DIM_MULTIPLE. The token count M = prod(x.shape[:-1]) may
be anything >= 0: the weight-gradient GEMM reads the columnwise copies of
x and dy zero-padded along M to the plan's wgrad_inner, and M = 0 gives an
empty y and zero gradients.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from fp8kit import recipe as recipe_lib
from fp8kit.jax import _checks, _ffi
from fp8kit.jax import _sharding as sh
from fp8kit.jax import _sharding_quantize as shq
from fp8kit.jax import matmul
from fp8kit.jax.delayed_scaling import (GRAD, KERNEL, X, DelayedScalingState, check_state,
                                        quantize_and_record)
from fp8kit.jax.scaled_tensor import ScaledTensor

_FN = "fp8kit.jax.dense"


@dataclasses.dataclass(frozen=True)
class _Types:
    """The sharding types (PartitionSpecs) of the arguments and of y, under
    Explicit mesh axes (_sharding.py): the custom calls' results are typed
    replicated, and custom_vjp requires each cotangent to have its primal's
    type. y is typed as a dot would be: its rows sharded as x's, its
    columns as the kernel's (a sharded K is summed inside the GEMM)."""

    x: P
    kernel: P
    bias: Optional[P]
    state: Optional[tuple[P, ...]]

    @property
    def y(self) -> P:
        rows, cols = sh.spec_axes(self.x, 0), sh.spec_axes(self.kernel, 1)
        if set(rows) & set(cols):
            cols = ()
        return sh.spec_of([rows, cols])

    @classmethod
    def of(cls, x, kernel, bias, state) -> Optional["_Types"]:
        """The types of these arguments, or None without Explicit axes."""
        x_spec = sh.explicit_spec(x)
        if x_spec is None:
            return None
        return cls(x=x_spec, kernel=sh.explicit_spec(kernel),
                   bias=None if bias is None else sh.explicit_spec(bias),
                   state=None if state is None else tuple(
                       sh.explicit_spec(a) for a in jax.tree_util.tree_leaves(state)))


@dataclasses.dataclass(frozen=True)
class _Config:
    """Everything static about one dense call (custom_vjp's nondiff arg)."""

    recipe: recipe_lib.DelayedScaling | recipe_lib.CurrentScaling
    non_tn: bool                  # the device's FP8 GEMM reads non-K-contiguous operands
    x_dtype: jnp.dtype
    kernel_dtype: jnp.dtype
    bias_dtype: Optional[jnp.dtype]
    types: Optional[_Types]       # None: no Explicit mesh axes in context
    # The gradient GEMMs promote partial sums to FP32 (split accumulation);
    # the forward GEMM too unless the recipe asks for fast accumulation.
    bwd_split_accumulator: bool = True

    @property
    def fwd_split_accumulator(self) -> bool:
        return not self.recipe.forward_fast_accumulation

    @property
    def delayed(self) -> bool:
        return isinstance(self.recipe, recipe_lib.DelayedScaling)

    def fmt(self, slot: int) -> str:
        f = self.recipe.fp8_format
        return f.backward_dtype if slot == GRAD else f.forward_dtype

    def plan(self, m: int, k: int, n: int, grads: bool) -> dict:
        """The core's copy plan for this call (grads: dgrad and wgrad)."""
        return _ffi.linear_plan(m, k, n, grads, grads, self.non_tn)


def _keep(st: ScaledTensor, copies) -> ScaledTensor:
    """st with only the copies (rowwise, columnwise) the plan keeps."""
    rowwise, columnwise = copies
    return dataclasses.replace(st, data=st.data if rowwise else None,
                               columnwise_data=st.columnwise_data if columnwise else None)


def _quantize_current(cfg: _Config, t, slot: int, copies, sums_dtype=None):
    """One current-scaling cast: (ScaledTensor, column sums or None)."""
    r = cfg.recipe
    rowwise, columnwise = copies
    data, columnwise_data, _, scale_inv, amax, sums = shq.quantize_current_scaling(
        t, cfg.fmt(slot), rowwise, columnwise, r.amax_epsilon, r.power_2_scale, sums_dtype)
    st = ScaledTensor(data=data if rowwise else None, scale_inv=scale_inv,
                      columnwise_data=columnwise_data if columnwise else None, amax=amax,
                      fp8_dtype=cfg.fmt(slot))
    return st, (sums if sums_dtype is not None else None)


def _quantize_forward(cfg: _Config, x, kernel, state, plan: dict, record: bool):
    """Q(x), Q(kernel) with the plan's copies: for delayed scaling one
    fused call (recorded when differentiating). Returns (state, xq, kq)."""
    copies = plan["quantize"]
    if cfg.delayed:
        state, (xq, kq), _ = quantize_and_record(state, cfg.recipe, X, (x, kernel),
                                                 (copies[X], copies[KERNEL]), (None, None), record)
        return state, xq, kq
    return (state, _quantize_current(cfg, x, X, copies[X])[0],
            _quantize_current(cfg, kernel, KERNEL, copies[KERNEL])[0])


def _forward_gemm(cfg: _Config, xq: ScaledTensor, kq: ScaledTensor, bias, n: int):
    out = cfg.x_dtype
    if xq.shape[0] == 0:  # M = 0: nothing to multiply
        return jnp.zeros((0, n), out)
    # The GEMM epilogue adds a bias of the output's 16-bit type; a float32
    # output gets its bias added outside, in float32, to lose nothing.
    in_epilogue = bias is not None and out != jnp.float32
    y = matmul.gemm_scaled(xq, kq, False, False, out, bias.astype(out) if in_epilogue else None,
                           cfg.fwd_split_accumulator, cfg.non_tn, _FN)
    if bias is not None and not in_epilogue:
        y = y + bias.astype(out)
    return y if cfg.types is None else sh.retype(y, cfg.types.y)


def _dense_primal(cfg: _Config, x, kernel, bias, state):
    # No gradient: the plan's forward-only copies, and a delayed state is
    # read (a fresh slot seeded from its tensor) but not recorded.
    (m, k), n = x.shape, kernel.shape[1]
    plan = cfg.plan(m, k, n, grads=False)
    _, xq, kq = _quantize_forward(cfg, x, kernel, state, plan, record=False)
    return _forward_gemm(cfg, xq, kq, bias, n)


def _dense_fwd(cfg: _Config, x, kernel, bias, state):
    (m, k), n = x.shape, kernel.shape[1]
    plan = cfg.plan(m, k, n, grads=True)
    state, xq, kq = _quantize_forward(cfg, x, kernel, state, plan, record=True)
    y = _forward_gemm(cfg, xq, kq, bias, n)
    # The forward's updated state travels to the backward, which records dy.
    return y, (_keep(xq, plan["saved_input"]), _keep(kq, plan["saved_weight"]), state)


def _pad_tokens(st: ScaledTensor, inner: int) -> ScaledTensor:
    """The columnwise copy [cols, M] zero-padded to [cols, inner] (FP8 zero
    bits are 0.0: the padding adds nothing to the wgrad sums)."""
    m = st.columnwise_data.shape[1]
    if inner == m:
        return st
    padded = jnp.pad(st.columnwise_data, ((0, 0), (0, inner - m)))
    return dataclasses.replace(st, data=None, columnwise_data=padded)


def _quantize_grad(cfg: _Config, dy, state, copies):
    """Q(dy) and the bias gradient from the same cast (column sums; the
    cast+transpose pass computes them, so a bias asks for the columnwise
    copy, and a single token row is summed here). Returns (state, dq, db)."""
    m, n = dy.shape
    sums_dtype = cfg.bias_dtype if cfg.bias_dtype is not None and m > 1 else None
    if sums_dtype is not None:
        copies = (copies[0], True)
    if cfg.delayed:
        state, (dq,), (db,) = quantize_and_record(state, cfg.recipe, GRAD, (dy,), (copies,),
                                                  (sums_dtype,), record=True)
    else:
        dq, db = _quantize_current(cfg, dy, GRAD, copies, sums_dtype)
    if cfg.bias_dtype is not None and sums_dtype is None:
        db = jnp.sum(dy.astype(jnp.float32), axis=0).astype(cfg.bias_dtype)
    return state, dq, db


def _dense_bwd(cfg: _Config, res, dy):
    x_saved, k_saved, state = res
    (m, n), k = dy.shape, k_saved.shape[0]
    plan = cfg.plan(m, k, n, grads=True)
    state, dq, db = _quantize_grad(cfg, dy, state, plan["quantize"][GRAD])
    split = cfg.bwd_split_accumulator
    if m == 0:
        dx = jnp.zeros((0, k), cfg.x_dtype)
        dk = jnp.zeros((k, n), cfg.kernel_dtype)
    else:
        dx = matmul.gemm_scaled(dq, k_saved, False, True, cfg.x_dtype, None, split, cfg.non_tn,
                                _FN)
        x_w, dq_w = x_saved, dq
        if plan["wgrad_columnwise"]:
            inner = plan["wgrad_inner"]
            x_w, dq_w = _pad_tokens(x_saved, inner), _pad_tokens(dq, inner)
        dk = matmul.gemm_scaled(x_w, dq_w, True, False, cfg.kernel_dtype, None, split,
                                cfg.non_tn, _FN)
    if cfg.types is not None:  # each cotangent with its primal's sharding type
        t = cfg.types
        dx, dk = sh.retype(dx, t.x), sh.retype(dk, t.kernel)
        db = None if db is None else sh.retype(db, t.bias)
        if cfg.delayed:
            leaves, tree = jax.tree_util.tree_flatten(state)
            state = tree.unflatten(map(sh.retype, leaves, t.state))
    return dx, dk, db, (state if cfg.delayed else None)


_dense = jax.custom_vjp(_dense_primal, nondiff_argnums=(0,))
_dense.defvjp(_dense_fwd, _dense_bwd)


def _check_state(recipe, state) -> None:
    if isinstance(recipe, recipe_lib.DelayedScaling):
        check_state(_FN, recipe, state)
    elif isinstance(recipe, recipe_lib.CurrentScaling):
        if state is not None:
            raise TypeError(f"{_FN}: CurrentScaling is stateless; pass state=None")
    else:
        raise TypeError(f"{_FN}: recipe must be fp8kit.recipe.DelayedScaling or CurrentScaling, "
                        f"got {type(recipe).__name__}")


def dense(x, kernel, bias=None, *, state: Optional[DelayedScalingState] = None, recipe):
    """FP8 dense layer: y = x @ kernel (+ bias), differentiable, jit/vmap-able.

    x:      [..., K] float32/bfloat16/float16; y has x's dtype and shape [..., N].
    kernel: [K, N] float32/bfloat16/float16 (its gradient has its dtype).
    bias:   [N] or None.
    recipe: fp8kit.recipe.DelayedScaling (then `state` is required: a
            DelayedScalingState.create(recipe), updated through its
            cotangent - see fp8kit/jax/delayed_scaling.py) or CurrentScaling
            (no state).
    """
    _check_state(recipe, state)
    _checks.high_precision(_FN, "x", x)
    _checks.high_precision(_FN, "kernel", kernel)
    x, kernel = jnp.asarray(x), jnp.asarray(kernel)
    if x.ndim < 2 or x.ndim > 8:
        raise ValueError(f"{_FN}: x has shape {x.shape}; expected [..., K] with 2 to 8 dims")
    if kernel.ndim != 2:
        raise ValueError(f"{_FN}: kernel has shape {kernel.shape}; expected [K, N]")
    k, n = kernel.shape
    if x.shape[-1] != k:
        raise ValueError(f"{_FN}: x has {x.shape[-1]} features (shape {x.shape}) but kernel "
                         f"expects K={k} (shape {kernel.shape})")
    multiple = _ffi.GEMM_DIM_MULTIPLE
    for name, dim in (("K", k), ("N", n)):
        if dim % multiple != 0 or dim == 0:
            raise ValueError(f"{_FN}: {name}={dim} must be a positive multiple of {multiple} "
                             "(cuBLASLt's FP8 GEMM alignment, enforced on CPU too); pad the "
                             "kernel.")
    bias_dtype = None
    if bias is not None:
        _checks.high_precision(_FN, "bias", bias)
        bias = jnp.asarray(bias)
        if bias.shape != (n,):
            raise ValueError(f"{_FN}: bias has shape {bias.shape}; expected ({n},)")
        bias_dtype = jnp.dtype(bias.dtype)
    lead = x.shape[:-1]
    x = x.reshape(math.prod(lead), k)
    cfg = _Config(recipe=recipe, non_tn=matmul.supports_non_tn_fp8_gemm(),
                  x_dtype=jnp.dtype(x.dtype), kernel_dtype=jnp.dtype(kernel.dtype),
                  bias_dtype=bias_dtype, types=_Types.of(x, kernel, bias, state))
    y = _dense(cfg, x, kernel, bias, state)
    return y.reshape(*lead, n)
