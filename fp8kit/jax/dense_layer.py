"""fp8kit.jax.dense: an FP8 dense layer (y = x @ kernel + bias) as a pure
function with a custom VJP.

Forward:  y  = Q(x) @ Q(kernel)                    E4M3 x E4M3 -> x.dtype
Backward: dx = Q(dy) @ Q(kernel)^T                 (E5M2 under HYBRID) -> x.dtype
          dk = Q(x)^T @ Q(dy)                      -> kernel.dtype
          db = sum(dy over tokens)                 (float32 sum, bias.dtype)
Every GEMM is an fp8kit custom call on FP8 data (no dequantize-then-dot).
Q is the recipe's quantizer: CurrentScaling quantizes each tensor with a
scale from its own amax (stateless); DelayedScaling uses the scales in
`state` and returns the updated state as the state's cotangent (see
fp8kit/jax/state.py for the convention).

Layouts: on devices whose FP8 GEMM is TN-only (CPU reference, Ada,
Hopper - the core's `supports_non_tn_fp8_gemm`), the backward GEMMs read
x, kernel and dy transposed; the quantizers write those transposed copies
in the same pass as the rowwise data, and the residuals keep only the
layouts the backward pass reads.

Shapes: x [..., K], kernel [K, N], bias [N]; K and N multiples of 16 and,
when differentiating, the token count prod(x.shape[:-1]) too (cuBLASLt's
FP8 alignment; wgrad reduces over tokens).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import jax
import jax.numpy as jnp

from fp8kit import recipe as recipe_lib
from fp8kit.jax import _checks
from fp8kit.jax import delayed_scaling as ds
from fp8kit.jax import gemm_op as gemm_lib
from fp8kit.jax import partitioning as part
from fp8kit.jax.scaled_tensor import ScaledTensor
from fp8kit.jax.state import GRAD, KERNEL, X, DelayedScalingState


@dataclasses.dataclass(frozen=True)
class _Config:
    """Everything static about one dense call (custom_vjp's nondiff arg)."""

    recipe: recipe_lib.DelayedScaling | recipe_lib.CurrentScaling
    non_tn: bool                  # the device's FP8 GEMM reads non-K-contiguous operands
    x_dtype: jnp.dtype
    kernel_dtype: jnp.dtype
    bias_dtype: Optional[jnp.dtype]
    # The gradient GEMMs promote partial sums to FP32 (split accumulation);
    # the forward GEMM too unless the recipe asks for fast accumulation.
    bwd_split_accumulator: bool = True

    @property
    def fwd_split_accumulator(self) -> bool:
        return not self.recipe.forward_fast_accumulation

    @property
    def delayed(self) -> bool:
        return isinstance(self.recipe, recipe_lib.DelayedScaling)

    def fmt(self, which: int) -> str:
        f = self.recipe.fp8_format
        return f.backward_dtype if which == GRAD else f.forward_dtype


def _quantize(cfg: _Config, t, which: int, state, rowwise: bool, columnwise: bool) -> ScaledTensor:
    fmt = cfg.fmt(which)
    if cfg.delayed:
        data, col, scale_inv, amax = part.quantize(t, state.scale[which], fmt, rowwise,
                                                   columnwise)
    else:
        r = cfg.recipe
        data, col, _, scale_inv, amax = part.quantize_current_scaling(
            t, fmt, rowwise, columnwise, r.amax_epsilon, r.power_2_scale)
    return ScaledTensor(data=data if rowwise else None, scale_inv=scale_inv,
                        columnwise_data=col if columnwise else None, amax=amax, fp8_dtype=fmt)


def _forward_gemm(cfg: _Config, xq: ScaledTensor, kq: ScaledTensor, bias):
    out = cfg.x_dtype
    # The GEMM epilogue adds a bias of the output's 16-bit type; a float32
    # output gets its bias added outside, in float32, to lose nothing.
    in_epilogue = bias is not None and out != jnp.float32
    y = gemm_lib.gemm_call(xq, kq, False, False, out,
                           bias.astype(out) if in_epilogue else None,
                           cfg.fwd_split_accumulator, cfg.non_tn, "fp8kit.jax.dense")
    if bias is not None and not in_epilogue:
        y = y + bias.astype(out)
    return y


def _dense_primal(cfg: _Config, x, kernel, bias, state):
    # No gradient wanted: quantize only the layouts the forward GEMM reads.
    xq = _quantize(cfg, x, X, state, rowwise=True, columnwise=False)
    kq = _quantize(cfg, kernel, KERNEL, state, rowwise=cfg.non_tn, columnwise=not cfg.non_tn)
    return _forward_gemm(cfg, xq, kq, bias)


def _dense_fwd(cfg: _Config, x, kernel, bias, state):
    m = x.shape[0]
    if m % 16 != 0:
        raise ValueError(
            f"fp8kit.jax.dense: differentiating needs the token count (prod(x.shape[:-1]) = {m}) "
            "to be a multiple of 16: the FP8 weight-gradient GEMM reduces over tokens and "
            "cuBLASLt's FP8 GEMMs need K % 16 == 0. Pad the batch.")
    tn = not cfg.non_tn
    xq = _quantize(cfg, x, X, state, rowwise=True, columnwise=tn)
    kq = _quantize(cfg, kernel, KERNEL, state, rowwise=True, columnwise=tn)
    y = _forward_gemm(cfg, xq, kq, bias)
    # Keep only what the backward GEMMs read: x for wgrad (transposed on TN
    # devices), the kernel for dgrad (rowwise is already K-contiguous).
    x_res = xq.columnwise_only() if tn else xq
    k_res = kq.rowwise_only()
    return y, (x_res, k_res, state)


def _dense_bwd(cfg: _Config, res, dy):
    x_res, k_res, state = res
    dq = _quantize(cfg, dy, GRAD, state, rowwise=True, columnwise=not cfg.non_tn)
    split = cfg.bwd_split_accumulator
    fn = "fp8kit.jax.dense"
    dx = gemm_lib.gemm_call(dq, k_res, False, True, cfg.x_dtype, None, split, cfg.non_tn, fn)
    dk = gemm_lib.gemm_call(x_res, dq, True, False, cfg.kernel_dtype, None, split, cfg.non_tn, fn)
    db = None
    if cfg.bias_dtype is not None:
        db = jnp.sum(dy.astype(jnp.float32), axis=0).astype(cfg.bias_dtype)
    dstate = None
    if cfg.delayed:
        r = cfg.recipe
        amaxes = jnp.stack([x_res.amax, k_res.amax, dq.amax])
        history, scale, _ = ds.delayed_scaling_update_call(
            state.amax_history, amaxes, state.scale, DelayedScalingState.formats(r), r.margin,
            r.amax_compute_algo)
        dstate = DelayedScalingState(amax_history=history, scale=scale)
    return dx, dk, db, dstate


_dense = jax.custom_vjp(_dense_primal, nondiff_argnums=(0,))
_dense.defvjp(_dense_fwd, _dense_bwd)


def dense(x, kernel, bias=None, *, state: Optional[DelayedScalingState] = None, recipe):
    """FP8 dense layer: y = x @ kernel (+ bias), differentiable, jit/vmap-able.

    x:      [..., K] float32/bfloat16/float16; y has x's dtype and shape [..., N].
    kernel: [K, N] float32/bfloat16/float16 (its gradient has its dtype).
    bias:   [N] or None.
    recipe: fp8kit.recipe.DelayedScaling (then `state` is required: a
            DelayedScalingState.create(recipe), updated through its
            cotangent - see fp8kit/jax/state.py) or CurrentScaling (no state).
    """
    fn = "fp8kit.jax.dense"
    if isinstance(recipe, recipe_lib.DelayedScaling):
        if not isinstance(state, DelayedScalingState):
            raise TypeError(f"{fn}: a DelayedScaling recipe needs state=DelayedScalingState."
                            f"create(recipe), got {type(state).__name__}")
        if tuple(state.amax_history.shape) != (3, recipe.amax_history_len) or \
                tuple(state.scale.shape) != (3,):
            raise ValueError(
                f"{fn}: state has amax_history {tuple(state.amax_history.shape)} and scale "
                f"{tuple(state.scale.shape)}; the recipe needs (3, {recipe.amax_history_len}) "
                "and (3,). Create it with DelayedScalingState.create(recipe).")
    elif isinstance(recipe, recipe_lib.CurrentScaling):
        if state is not None:
            raise TypeError(f"{fn}: CurrentScaling is stateless; pass state=None")
    else:
        raise TypeError(f"{fn}: recipe must be fp8kit.recipe.DelayedScaling or CurrentScaling, "
                        f"got {type(recipe).__name__}")
    _checks.high_precision(fn, "x", x)
    _checks.high_precision(fn, "kernel", kernel)
    x, kernel = jnp.asarray(x), jnp.asarray(kernel)
    if x.ndim < 2 or x.ndim > 8:
        raise ValueError(f"{fn}: x has shape {x.shape}; expected [..., K] with 2 to 8 dims")
    if kernel.ndim != 2:
        raise ValueError(f"{fn}: kernel has shape {kernel.shape}; expected [K, N]")
    k, n = kernel.shape
    if x.shape[-1] != k:
        raise ValueError(f"{fn}: x has {x.shape[-1]} features (shape {x.shape}) but kernel "
                         f"expects K={k} (shape {kernel.shape})")
    for name, dim in (("K", k), ("N", n)):
        if dim % 16 != 0 or dim == 0:
            raise ValueError(f"{fn}: {name}={dim} must be a positive multiple of 16 "
                             "(cuBLASLt's FP8 GEMM alignment, enforced on CPU too); pad the "
                             "kernel.")
    bias_dtype = None
    if bias is not None:
        _checks.high_precision(fn, "bias", bias)
        bias = jnp.asarray(bias)
        if bias.shape != (n,):
            raise ValueError(f"{fn}: bias has shape {bias.shape}; expected ({n},)")
        bias_dtype = bias.dtype
    cfg = _Config(recipe=recipe, non_tn=gemm_lib.supports_non_tn_fp8_gemm(),
                  x_dtype=jnp.dtype(x.dtype), kernel_dtype=jnp.dtype(kernel.dtype),
                  bias_dtype=None if bias_dtype is None else jnp.dtype(bias_dtype))
    lead = x.shape[:-1]
    y = _dense(cfg, x.reshape(math.prod(lead), k), kernel, bias, state)
    return y.reshape(*lead, n)
