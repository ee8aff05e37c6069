"""fp8kit.jax.dense: an FP8 dense layer (y = x @ kernel + bias) as a pure
function with a custom VJP, obeying the Linear layer protocol of
common/include/fp8kit/linear.h (the same bits as fp8kit.torch.Linear).

Forward:  y  = Q(x) @ Q(kernel)                    E4M3 x E4M3 -> x.dtype
Backward: dx = Q(dy) @ Q(kernel)^T                 (E5M2 under HYBRID) -> x.dtype
          dk = Q(x)^T @ Q(dy)                      -> kernel.dtype
          db = column sums of dy                   (from dy's cast, bias.dtype)
Every GEMM is an fp8kit custom call on FP8 data (no dequantize-then-dot).
Q is the recipe's quantizer: CurrentScaling quantizes each tensor with a
scale from its own amax (stateless); BlockScaling gives each 1x128 tile of
x and dy and each 128x128 block of the kernel a scale from its own amax
(stateless; _linear.py says how the tokens are padded); DelayedScaling
seeds, casts and records through the state (fp8kit/jax/delayed_scaling.py
says how, and how the updated state leaves as the state's cotangent).

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

from fp8kit.jax import _checks, _linear
from fp8kit.jax import _statistics_rows as stats_rows
from fp8kit.jax import _sharding as sh
from fp8kit.jax import matmul
from fp8kit.jax.delayed_scaling import (GRAD_OUTPUT, INPUT, WEIGHT, DelayedScalingState, note_use,
                                        quantize_and_record)

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

    linear: _linear.LinearCall    # the Linear's recipe, layouts, dtypes, state rows
    types: Optional[_Types]       # None: no Explicit mesh axes in context


def _quantize_forward(lin: _linear.LinearCall, x, kernel, state, plan: dict, record: bool):
    """Q(x), Q(kernel) with the plan's copies: for delayed scaling one
    fused call (recorded when differentiating). Returns (state, xq, kq)."""
    copies = plan["quantize"]
    if lin.delayed:
        state, (xq, kq), _ = quantize_and_record(state, lin.recipe, INPUT, (x, kernel),
                                                 (copies[INPUT], copies[WEIGHT]), (None, None),
                                                 record)
        return state, xq, kq
    state, kq = _linear.quantize_kernel(lin, kernel, state, copies[WEIGHT], record)
    return state, _linear.quantize_input(lin, x, copies[INPUT]), kq


def _forward(cfg: _Config, x, kernel, bias, state, grads: bool, stats=None):
    """y, and the forward's state, plan and statistics rows; not
    differentiating, a delayed state is read (a fresh slot seeded from its
    tensor) but not recorded."""
    lin = cfg.linear
    m, n = x.shape[0], kernel.shape[1]
    x = _linear.pad_token_rows(lin, x)
    plan = lin.plan(*x.shape, n, grads)
    state, xq, kq = _quantize_forward(lin, x, kernel, state, plan, record=grads)
    stats = stats_rows.record(stats, INPUT, x, xq, m * x.shape[1])
    stats = stats_rows.record(stats, WEIGHT, kernel, kq, kernel.size)
    y = _linear.unpad_token_rows(_linear.forward_gemm(lin, xq, kq, bias, n), m)
    y = y if cfg.types is None else sh.retype(y, cfg.types.y)
    return y, state, plan, xq, kq, stats


def _dense_primal(cfg: _Config, x, kernel, bias, state, stats):
    return _forward(cfg, x, kernel, bias, state, grads=False)[0]


def _dense_fwd(cfg: _Config, x, kernel, bias, state, stats):
    y, state, plan, xq, kq, stats = _forward(cfg, x, kernel, bias, state, True, stats)
    # The forward's updated state (and statistics) travel to the backward,
    # which records dy.
    return y, (_linear.keep(xq, plan["saved_input"]), _linear.keep(kq, plan["saved_weight"]),
               state, stats)


def _dense_bwd(cfg: _Config, res, dy):
    lin = cfg.linear
    x_saved, k_saved, state, stats = res
    m, (k, n) = dy.shape[0], k_saved.shape
    dy = _linear.pad_token_rows(lin, dy)
    plan = lin.plan(dy.shape[0], k, n, grads=True)
    state, dq, db = _linear.quantize_grad(lin, dy, state, plan["quantize"][GRAD_OUTPUT])
    stats = stats_rows.record(stats, GRAD_OUTPUT, dy, dq, m * n)
    dx, dk = _linear.grad_gemms(lin, plan, dq, x_saved, k_saved)
    dx = _linear.unpad_token_rows(dx, m)
    if cfg.types is not None:  # each cotangent with its primal's sharding type
        t = cfg.types
        dx, dk = sh.retype(dx, t.x), sh.retype(dk, t.kernel)
        db = None if db is None else sh.retype(db, t.bias)
        if lin.delayed:
            leaves, tree = jax.tree_util.tree_flatten(state)
            state = tree.unflatten(map(sh.retype, leaves, t.state))
    return dx, dk, db, (state if lin.delayed else None), stats


_dense = jax.custom_vjp(_dense_primal, nondiff_argnums=(0,))
_dense.defvjp(_dense_fwd, _dense_bwd)


def dense(x, kernel, bias=None, *, state: Optional[DelayedScalingState] = None, recipe,
          statistics=None):
    """FP8 dense layer: y = x @ kernel (+ bias), differentiable, jit/vmap-able.

    x:      [..., K] float32/bfloat16/float16; y has x's dtype and shape [..., N].
    kernel: [K, N] float32/bfloat16/float16 (its gradient has its dtype).
    bias:   [N] or None.
    recipe: fp8kit.recipe.DelayedScaling (then `state` is required: a
            DelayedScalingState.create(recipe), updated through its
            cotangent - see fp8kit/jax/delayed_scaling.py), CurrentScaling
            or BlockScaling (no state; block-scaled GEMMs need a device
            where supports_block_scaled_fp8_gemm: Hopper, or the CPU).
    An inf or NaN in x, kernel or the gradient is never saturated: the
    outputs it reaches are non-finite, as in bf16 (fp8kit.recipe says how
    the scales treat it).
    statistics: None, or fp8kit.jax.statistics_rows(1): then the gradient
            with respect to it is the cast statistics of this call's input,
            kernel and output gradient (fp8kit.jax.tensor_statistics reads
            them); nothing else changes.
    """
    _linear.check_recipe_state(_FN, recipe, state)
    _checks.high_precision(_FN, "x", x)
    x = jnp.asarray(x)
    if x.ndim < 2 or x.ndim > 8:
        raise ValueError(f"{_FN}: x has shape {x.shape}; expected [..., K] with 2 to 8 dims")
    kernel = _linear.check_kernel(_FN, "kernel", kernel, x.shape, "x")
    k, n = kernel.shape
    bias = _linear.check_bias(_FN, "bias", bias, n)
    bias_dtype = None if bias is None else jnp.dtype(bias.dtype)
    lead = x.shape[:-1]
    x = x.reshape(math.prod(lead), k)
    lin = _linear.LinearCall(fn=_FN, recipe=recipe, non_tn=matmul.supports_non_tn_fp8_gemm(),
                             x_dtype=jnp.dtype(x.dtype), kernel_dtype=jnp.dtype(kernel.dtype),
                             bias_dtype=bias_dtype, input_slot=INPUT, kernel_slot=WEIGHT,
                             grad_slot=GRAD_OUTPUT)
    cfg = _Config(linear=lin, types=_Types.of(x, kernel, bias, state))
    note_use(_FN, state)
    statistics = stats_rows.check(_FN, statistics, 1)
    y = _dense(cfg, x, kernel, bias, state, statistics)
    return y.reshape(*lead, n)
