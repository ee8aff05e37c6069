"""fp8kit.jax.layernorm_dense: y = norm(x) @ kernel + bias in FP8 as a pure
function with a custom VJP: fp8kit.jax.dense (one Linear of
common/include/fp8kit/linear.h, the same state of three rows) whose input
cast is fused into the norm.

Forward:  ln = Q(norm(x))     the norm kernel writes the GEMM's FP8 input
          y  = ln @ Q(kernel) (+ bias)                      -> x.dtype
Backward: d_ln = Q(dy) @ Q(kernel)^T, dk = ln^T @ Q(dy), db = sums of dy
          dx, dgamma, dbeta from the norm backward.
The forward keeps x, mean, rsigma and the FP8 copies of ln and the kernel
the plan keeps; the high-precision norm output is written only when the
call records its statistics (then read at once, not kept).

BlockScaling: the norm is the core's kernel without its cast, in x's
dtype, and ln is cast 1x128 by a block quantization of its own (fp8kit/jax/_fused_block_steps.py), the kernel
128x128 and dy 1x128, as fp8kit.jax.dense does; no state. The GEMMs see
the tokens padded with zero rows to a multiple of 16 (_linear.py says why
that changes nothing), y and d_ln are sliced back. Sharded over the
tokens, each device must hold a multiple of 128 of them (whole tiles of
the wgrad's columnwise copies); otherwise a ValueError says so.

Shapes: x [..., hidden], gamma and beta [hidden] (beta None for RMSNorm),
kernel [hidden, N], bias [N]; hidden and N positive multiples of 16; any
token count >= 0. State rows as dense's: 0 the norm output (the GEMM's
input), 1 the kernel, 2 the output gradient. Sharding: data parallel over
the tokens as fp8kit.jax.layernorm_mlp (fp8kit/jax/fused_mlp_layer.py).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import jax
import jax.numpy as jnp

from fp8kit.jax import _fused_steps as steps
from fp8kit.jax import _linear, matmul
from fp8kit.jax import _statistics_rows as stats_rows
from fp8kit.jax._linear import LinearCall
from fp8kit.jax.delayed_scaling import (GRAD_OUTPUT, INPUT, WEIGHT, DelayedScalingState,
                                        note_use)

_FN = "fp8kit.jax.layernorm_dense"


@dataclasses.dataclass(frozen=True)
class _Config:
    """Everything static about one call (custom_vjp's nondiff arg)."""

    linear: LinearCall
    normalization: str
    epsilon: float
    gamma_dtype: jnp.dtype
    beta_dtype: Optional[jnp.dtype]
    specs: Optional[tuple]  # the arguments' sharding types (Explicit axes), else None


def _forward(cfg: _Config, x, gamma, beta, kernel, bias, state, stats, grads: bool):
    lin = cfg.linear
    (m, hidden), n = x.shape, kernel.shape[1]
    plan = lin.plan(lin.gemm_rows(m), hidden, n, grads)
    gamma, beta = gamma.astype(x.dtype), None if beta is None else beta.astype(x.dtype)
    # With statistics the norm also writes the values it casts, to record them.
    state, ln, mean, rsigma, ln_hp = steps.norm_forward(lin, cfg.normalization, cfg.epsilon, x,
                                                        gamma, beta, state,
                                                        plan["quantize"][INPUT], grads,
                                                        stats is not None)
    state, kq = _linear.quantize_kernel(lin, kernel, state, plan["quantize"][WEIGHT], grads)
    stats = stats_rows.record(stats, INPUT, ln_hp, ln, x.size)
    stats = stats_rows.record(stats, WEIGHT, kernel, kq, kernel.size)
    y = _linear.unpad_token_rows(_linear.forward_gemm(lin, ln, kq, bias, n), m)
    y = steps.retype_rows(y, cfg.specs)
    saved = (x, gamma, mean, rsigma, _linear.keep(ln, plan["saved_input"]),
             _linear.keep(kq, plan["saved_weight"]), state, stats)
    return y, saved


def _primal(cfg, x, gamma, beta, kernel, bias, state, stats):
    return _forward(cfg, x, gamma, beta, kernel, bias, state, None, False)[0]


def _fwd(cfg, x, gamma, beta, kernel, bias, state, stats):
    return _forward(cfg, x, gamma, beta, kernel, bias, state, stats, True)


def _bwd(cfg: _Config, res, dy):
    lin = cfg.linear
    x, gamma, mean, rsigma, ln, kq, state, stats = res
    (m, hidden), n = x.shape, dy.shape[1]
    dy = _linear.pad_token_rows(lin, dy)
    plan = lin.plan(dy.shape[0], hidden, n, True)
    state, dq, db = _linear.quantize_grad(lin, dy, state, plan["quantize"][GRAD_OUTPUT])
    stats = stats_rows.record(stats, GRAD_OUTPUT, dy, dq, m * n)
    d_ln, dk = _linear.grad_gemms(lin, plan, dq, ln, kq)
    d_ln = _linear.unpad_token_rows(d_ln, m)
    dx, dgamma, dbeta = steps.norm_backward(cfg.normalization, cfg.epsilon, d_ln, x, mean,
                                            rsigma, gamma, cfg.gamma_dtype)
    if dbeta is not None:
        dbeta = dbeta.astype(cfg.beta_dtype)
    grads = (dx, dgamma, dbeta, dk, db, state if lin.delayed else None, stats)
    return steps.retype_like(grads, cfg.specs)


_layernorm_dense = jax.custom_vjp(_primal, nondiff_argnums=(0,))
_layernorm_dense.defvjp(_fwd, _bwd)


def layernorm_dense(x, gamma, beta, kernel, bias=None, *, normalization: str = "layernorm",
                    epsilon: float = 1e-5, state: Optional[DelayedScalingState] = None,
                    recipe, statistics=None):
    """FP8 norm + dense: y = norm(x) @ kernel (+ bias), differentiable.

    x:           [..., hidden] float32/bfloat16/float16; y has x's dtype, [..., N].
    gamma, beta: [hidden]; beta None for normalization="rmsnorm".
    kernel:      [hidden, N]; bias: [N] or None.
    recipe:      fp8kit.recipe.DelayedScaling (then `state` is required:
                 DelayedScalingState.create(recipe), updated through its
                 cotangent), CurrentScaling or BlockScaling (no state).
    An inf or NaN in x or a weight is never saturated: the outputs it
    reaches are non-finite, as in bf16 (fp8kit.recipe says how the scales
    treat it).
    statistics:  None, or fp8kit.jax.statistics_rows(1): the gradient with
                 respect to it holds the cast statistics of the norm output
                 (the GEMM's input), the kernel and the output gradient
                 (fp8kit.jax.tensor_statistics reads them). The norm kernel
                 then also writes the norm output in x's dtype, the values
                 it casts, for those statistics.
    """
    x, gamma, beta, epsilon = steps.check_norm_args(_FN, x, gamma, beta, normalization, epsilon)
    _linear.check_recipe_state(_FN, recipe, state)
    steps.refuse_vmapped_state(_FN, recipe, x, gamma, beta, kernel, bias, state)
    kernel = _linear.check_kernel(_FN, "kernel", kernel, x.shape, "x")
    bias = _linear.check_bias(_FN, "bias", bias, kernel.shape[1])
    lead, hidden, n = x.shape[:-1], x.shape[-1], kernel.shape[1]
    x = x.reshape(math.prod(lead), hidden)
    dtype = lambda a: None if a is None else jnp.dtype(a.dtype)  # noqa: E731
    lin = LinearCall(fn=_FN, recipe=recipe, non_tn=matmul.supports_non_tn_fp8_gemm(),
                     x_dtype=jnp.dtype(x.dtype), kernel_dtype=dtype(kernel),
                     bias_dtype=dtype(bias), input_slot=INPUT, kernel_slot=WEIGHT,
                     grad_slot=GRAD_OUTPUT)
    args = (x, gamma, beta, kernel, bias, state, stats_rows.check(_FN, statistics, 1))
    cfg = _Config(linear=lin, normalization=normalization, epsilon=epsilon,
                  gamma_dtype=dtype(gamma), beta_dtype=dtype(beta),
                  specs=steps.explicit_specs(*args))
    note_use(_FN, state)
    return _layernorm_dense(cfg, *args).reshape(*lead, n)
