"""fp8kit.jax.layernorm_mlp: a transformer MLP block in FP8,
y = act(norm(x) @ kernel_1 + bias_1) @ kernel_2 + bias_2, as a pure
function with a custom VJP. Its two Linears (fc1, fc2) obey the Linear
layer protocol of common/include/fp8kit/linear.h as fp8kit.jax.dense
does, with the casts of their inputs fused into the ops that produce them:

Forward:  ln = Q(norm(x))       the norm kernel writes fc1's FP8 input
          h  = ln @ Q(kernel_1) + bias_1                  -> x.dtype
          a  = Q(act(h))        the activation kernel writes fc2's FP8 input
          y  = a @ Q(kernel_2) + bias_2                   -> x.dtype
Backward: d_a = Q(dy) @ Q(kernel_2)^T, dk_2 = a^T @ Q(dy), db_2 = sums of dy
          dh  = Q(d_a * act'(h)) (the activation backward casts it, and sums
                its columns for db_1)
          d_ln = dh @ Q(kernel_1)^T, dk_1 = ln^T @ dh
          dx, dgamma, dbeta from the norm backward.
Every GEMM is an fp8kit custom call on FP8 data. The forward keeps for
backward x, the norm's mean and rsigma, h (the activation backward reads
it) and the FP8 copies the plans keep of ln, a and the kernels. The
high-precision norm and activation outputs and dh are written only when
the call records its statistics (then read at once, not kept).

BlockScaling: the norm, the activation and its backward are the core's
kernels without their cast, in x's dtype (as fp8kit.torch's layers run
them), and ln, a and dh are cast 1x128 by block quantizations of their own
(fp8kit/jax/_fused_block_steps.py; db_1 is dh's float32 column sum),
the kernels 128x128 and dy 1x128, as fp8kit.jax.dense does; no state.
The GEMMs see the tokens padded with zero rows to a multiple of 16
(_linear.py says why that changes nothing); h, y and the GEMMs' input
gradients are sliced back to the real rows. Sharded over the tokens,
each device must hold a multiple of 128 of them (whole tiles of the
wgrad's columnwise copies); otherwise a ValueError says so.

Shapes: x [..., hidden]; gamma, beta [hidden]; kernel_1 [hidden, F]
(GELU) or, for SwiGLU, [hidden, 2F] = [gate | up] along the last dim (the
gate is kernel_1[:, :F], the up projection kernel_1[:, F:]) or the paired
[hidden, 2, F] (gate kernel_1[:, 0], up kernel_1[:, 1]: the layout for
tensor parallelism, fp8kit/jax/_mlp_fc1.py); kernel_2 [F, N]; bias_1
kernel_1.shape[1:], bias_2 [N]. hidden, F and N are positive multiples of
the GEMM alignment (16); the token count may be anything >= 0.

Delayed scaling: one DelayedScalingState of two Linears,
DelayedScalingState.create(recipe, num_linears=2), rows
    0 fc1 input (the norm output)   3 fc2 kernel
    1 fc1 kernel                    4 fc1 output gradient (dh, backward format)
    2 fc2 input (the activation)    5 fc2 output gradient (dy, backward format)
updated as dense's (fp8kit/jax/delayed_scaling.py): seeded by the first
cast, recorded in a differentiated call, the new state returned as the
state's cotangent.

Sharding (a mesh in context): data parallel over the tokens and tensor
parallel over F (Megatron's layout): shard x's tokens, kernel_1 and bias_1
along F (their last dim) and kernel_2 along its rows. The norm then runs
on each device's tokens, fc1 gives each device its columns of h, the
activation runs on them, and fc2 sums its devices' partial products over
the tensor axis (psum; y is replicated over it); backward mirrors it
(d_ln summed over the tensor axis). Every cast takes its scale from the
global amax (pmax over the axes its tensor is split on), so the FP8 bytes
and the delayed-scaling state are the unsharded call's; the GEMMs follow
fp8kit.jax.gemm's rules (an F slice that breaks their alignment is
replicated). SwiGLU's [hidden, 2F] kernel_1 sharded along its columns is
refused (a device would hold gates without their ups; _mlp_fc1.py says
when): use the paired [hidden, 2, F]. Under BlockScaling each device must hold whole blocks (in
training, F per device a multiple of 512: 128x128 blocks and their scales'
4-block padding), refused otherwise with the mesh axis named. The norm's
hidden dimension is replicated.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import jax
import jax.numpy as jnp

from fp8kit.jax import _fused_steps as steps
from fp8kit.jax import _linear, matmul
from fp8kit.jax import _mlp_fc1 as fc1_steps
from fp8kit.jax import _statistics_rows as stats_rows
from fp8kit.jax.delayed_scaling import DelayedScalingState, note_use
from fp8kit.jax._linear import LinearCall

_FN = "fp8kit.jax.layernorm_mlp"
ACTIVATIONS = ("gelu", "swiglu")
# Rows of the state (module docstring).
FC1_INPUT, FC1_KERNEL, FC2_INPUT, FC2_KERNEL, FC1_GRAD, FC2_GRAD = range(6)
_X, _KERNEL, _GRAD = 0, 1, 2  # the plan's slots


@dataclasses.dataclass(frozen=True)
class _Config:
    """Everything static about one call (custom_vjp's nondiff arg)."""

    fc1: LinearCall
    fc2: LinearCall
    normalization: str
    epsilon: float
    activation: str
    gamma_dtype: jnp.dtype
    beta_dtype: Optional[jnp.dtype]
    specs: Optional[tuple]  # the arguments' sharding types (Explicit axes), else None
    fc1_axes: Optional[tuple]  # _mlp_fc1.explicit_axes

    def plans(self, m: int, hidden: int, n1: int, n2: int, grads: bool):
        f = n1 // 2 if self.activation == "swiglu" else n1
        return self.fc1.plan(m, hidden, n1, grads), self.fc2.plan(m, f, n2, grads)


def _whole_copy(q):
    """The cast of kernel_1 or dh as one ScaledTensor, or None (the halves of
    a paired one cast block by block have no whole)."""
    return q.whole if isinstance(q, fc1_steps.Pair) else q


def _forward(cfg: _Config, x, gamma, beta, kernel_1, bias_1, kernel_2, bias_2, state, stats,
             grads: bool):
    (m, hidden), n1, n2 = x.shape, math.prod(kernel_1.shape[1:]), kernel_2.shape[1]
    plan1, plan2 = cfg.plans(cfg.fc1.gemm_rows(m), hidden, n1, n2, grads)
    gamma, beta = gamma.astype(x.dtype), None if beta is None else beta.astype(x.dtype)
    # With statistics the fused kernels also write the values they cast
    # (ln_hp, a_hp), to record them.
    write_hp = stats is not None
    state, ln, mean, rsigma, ln_hp = steps.norm_forward(cfg.fc1, cfg.normalization, cfg.epsilon,
                                                        x, gamma, beta, state,
                                                        plan1["quantize"][_X], grads, write_hp)
    state, k1 = fc1_steps.quantize_kernel(cfg.fc1, kernel_1, state, plan1["quantize"][_KERNEL],
                                          grads)
    h = fc1_steps.forward_gemm(cfg.fc1, ln, k1, bias_1, m, cfg.fc1_axes)
    state, a, a_hp = steps.activation_forward(cfg.fc2, cfg.activation, h, state,
                                              plan2["quantize"][_X], grads, write_hp)
    state, k2 = _linear.quantize_kernel(cfg.fc2, kernel_2, state, plan2["quantize"][_KERNEL],
                                        grads)
    stats = stats_rows.record(stats, FC1_INPUT, ln_hp, ln, x.size)
    if _whole_copy(k1) is not None:
        stats = stats_rows.record(stats, FC1_KERNEL, kernel_1, _whole_copy(k1), kernel_1.size)
    stats = stats_rows.record(stats, FC2_INPUT, a_hp, a, m * kernel_2.shape[0])
    stats = stats_rows.record(stats, FC2_KERNEL, kernel_2, k2, kernel_2.size)
    y = _linear.unpad_token_rows(_linear.forward_gemm(cfg.fc2, a, k2, bias_2, n2), m)
    y = steps.retype_rows(y, cfg.specs)
    saved = (x, gamma, mean, rsigma, _linear.keep(ln, plan1["saved_input"]),
             fc1_steps.keep(k1, plan1["saved_weight"]), h, _linear.keep(a, plan2["saved_input"]),
             _linear.keep(k2, plan2["saved_weight"]), state, stats)
    return y, saved


def _primal(cfg, x, gamma, beta, kernel_1, bias_1, kernel_2, bias_2, state, stats):
    return _forward(cfg, x, gamma, beta, kernel_1, bias_1, kernel_2, bias_2, state, None,
                    False)[0]


def _fwd(cfg, x, gamma, beta, kernel_1, bias_1, kernel_2, bias_2, state, stats):
    return _forward(cfg, x, gamma, beta, kernel_1, bias_1, kernel_2, bias_2, state, stats, True)


def _bwd(cfg: _Config, res, dy):
    x, gamma, mean, rsigma, ln, k1, h, a, k2, state, stats = res
    (m, hidden), n1, n2 = x.shape, math.prod(h.shape[1:]), dy.shape[1]
    dy = _linear.pad_token_rows(cfg.fc2, dy)
    plan1, plan2 = cfg.plans(dy.shape[0], hidden, n1, n2, True)
    state, dq2, db2 = _linear.quantize_grad(cfg.fc2, dy, state, plan2["quantize"][_GRAD])
    stats = stats_rows.record(stats, FC2_GRAD, dy, dq2, m * n2)
    d_a, dk2 = _linear.grad_gemms(cfg.fc2, plan2, dq2, a, k2)
    state, dh, db1, dh_hp = steps.activation_backward(cfg.fc1, cfg.activation,
                                                      _linear.unpad_token_rows(d_a, m), h, state,
                                                      plan1["quantize"][_GRAD], stats is not None)
    if _whole_copy(dh) is not None:
        stats = stats_rows.record(stats, FC1_GRAD, dh_hp, _whole_copy(dh), m * n1)
    d_ln, dk1 = fc1_steps.grad_gemms(cfg.fc1, plan1, dh, ln, k1, cfg.fc1_axes)
    d_ln = _linear.unpad_token_rows(d_ln, m)
    dx, dgamma, dbeta = steps.norm_backward(cfg.normalization, cfg.epsilon, d_ln, x, mean,
                                            rsigma, gamma, cfg.gamma_dtype)
    if dbeta is not None:
        dbeta = dbeta.astype(cfg.beta_dtype)
    grads = (dx, dgamma, dbeta, dk1, db1, dk2, db2, state if cfg.fc1.delayed else None, stats)
    return steps.retype_like(grads, cfg.specs)


_mlp = jax.custom_vjp(_primal, nondiff_argnums=(0,))
_mlp.defvjp(_fwd, _bwd)


def layernorm_mlp(x, gamma, beta, kernel_1, kernel_2, bias_1=None, bias_2=None, *,
                  normalization: str = "layernorm", activation: str = "gelu",
                  epsilon: float = 1e-5, state: Optional[DelayedScalingState] = None, recipe,
                  statistics=None):
    """FP8 MLP block: act(norm(x) @ kernel_1 + bias_1) @ kernel_2 + bias_2.

    x:            [..., hidden] float32/bfloat16/float16; y has x's dtype, [..., N].
    gamma, beta:  [hidden]; beta None for normalization="rmsnorm".
    kernel_1:     [hidden, F] (activation="gelu", tanh approximation) or
                  [hidden, 2F] = [gate | up] or the paired [hidden, 2, F]
                  (activation="swiglu"; the paired layout for sharding F).
    kernel_2:     [F, N].  bias_1: kernel_1.shape[1:] or None; bias_2: [N] or None.
    recipe:       fp8kit.recipe.DelayedScaling (then `state` is required:
                  DelayedScalingState.create(recipe, num_linears=2), updated
                  through its cotangent), CurrentScaling or BlockScaling (no
                  state).
    An inf or NaN in x or a weight is never saturated: the outputs it
    reaches are non-finite, as in bf16 (fp8kit.recipe says how the scales
    treat it).
    statistics:   None, or fp8kit.jax.statistics_rows(2): the gradient with
                  respect to it holds the cast statistics of both Linears'
                  inputs (the norm output and the activation), kernels and
                  output gradients (dh and dy); rows as the state's,
                  tensor_statistics reads them. The fused kernels then also
                  write the values they cast in x's dtype, for those
                  statistics. A paired kernel_1 and its dh under
                  BlockScaling are cast half by half: their rows are not
                  recorded.
    """
    x, gamma, beta, epsilon = steps.check_norm_args(_FN, x, gamma, beta, normalization, epsilon)
    _linear.check_recipe_state(_FN, recipe, state, num_linears=2)
    steps.refuse_vmapped_state(_FN, recipe, x, gamma, beta, kernel_1, kernel_2, bias_1, bias_2,
                               state)
    if activation not in ACTIVATIONS:
        raise ValueError(f"{_FN}: activation={activation!r}; use 'gelu' or 'swiglu'")
    swiglu = activation == "swiglu"
    if swiglu and jnp.ndim(kernel_1) == 3:
        kernel_1, bias_1 = fc1_steps.check_paired(_FN, kernel_1, bias_1, x.shape)
        f, f_of = kernel_1.shape[2], "the activation (paired SwiGLU: kernel_1.shape[2])"
    else:
        kernel_1 = _linear.check_kernel(_FN, "kernel_1", kernel_1, x.shape, "x",
                                        n_multiple=2 if swiglu else 1)
        bias_1 = _linear.check_bias(_FN, "bias_1", bias_1, kernel_1.shape[1])
        f = kernel_1.shape[1] // 2 if swiglu else kernel_1.shape[1]
        f_of = ("the activation (SwiGLU: kernel_1.shape[1] / 2)" if swiglu
                else "the activation (kernel_1.shape[1])")
    kernel_2 = _linear.check_kernel(_FN, "kernel_2", kernel_2, (f,), f_of)
    fc1_steps.check_sharding(_FN, activation, kernel_1)
    bias_2 = _linear.check_bias(_FN, "bias_2", bias_2, kernel_2.shape[1])
    lead, hidden, n = x.shape[:-1], x.shape[-1], kernel_2.shape[1]
    x = x.reshape(math.prod(lead), hidden)
    non_tn = matmul.supports_non_tn_fp8_gemm()
    dtype = lambda a: None if a is None else jnp.dtype(a.dtype)  # noqa: E731
    fc1 = LinearCall(fn=_FN, recipe=recipe, non_tn=non_tn, x_dtype=jnp.dtype(x.dtype),
                     kernel_dtype=dtype(kernel_1), bias_dtype=dtype(bias_1),
                     input_slot=FC1_INPUT, kernel_slot=FC1_KERNEL, grad_slot=FC1_GRAD)
    fc2 = LinearCall(fn=_FN, recipe=recipe, non_tn=non_tn, x_dtype=jnp.dtype(x.dtype),
                     kernel_dtype=dtype(kernel_2), bias_dtype=dtype(bias_2),
                     input_slot=FC2_INPUT, kernel_slot=FC2_KERNEL, grad_slot=FC2_GRAD)
    args = (x, gamma, beta, kernel_1, bias_1, kernel_2, bias_2, state,
            stats_rows.check(_FN, statistics, 2))
    cfg = _Config(fc1=fc1, fc2=fc2, normalization=normalization, epsilon=epsilon,
                  activation=activation, gamma_dtype=dtype(gamma), beta_dtype=dtype(beta),
                  specs=steps.explicit_specs(*args),
                  fc1_axes=fc1_steps.explicit_axes(x, kernel_1))
    note_use(_FN, state)
    y = _mlp(cfg, *args)
    return y.reshape(*lead, n)
