"""The demo model in JAX: a jit-compiled training step, FP8 through
fp8kit.jax.dense with an explicit delayed-scaling state, or plain bf16.

FP8 scaling state: one fp8kit.jax.DelayedScalingState per FP8 layer. The
step differentiates the loss with respect to the states as well as the
weights; the "gradient" of each state is its updated value (the amax of the
output gradient only exists in the backward pass - see
fp8kit.jax.DelayedScalingState), so it replaces the state instead of being
applied by the optimizer.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

import fp8kit.jax as fj
from fp8kit import recipe as recipe_lib
from fp8kit.demo.result import RunResult
from fp8kit.demo.task import Config, Data

BF16 = jnp.bfloat16
ADAM_B1, ADAM_B2, ADAM_EPS = 0.9, 0.99, 1e-8


def _layer_norm(x, scale, bias):
    x = x.astype(jnp.float32)
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return ((x - mean) * jax.lax.rsqrt(var + 1e-5) * scale + bias).astype(BF16)


def _bf16_dense(x, kernel, bias):
    return jnp.dot(x, kernel.astype(BF16)) + bias.astype(BF16)


def _logits(params, states, ctx, recipe):
    """ctx int32 [B, context] -> float32 logits [B, vocab]. recipe None: the
    block's projections in bf16; else in FP8 with `states` (two
    DelayedScalingStates per block, or None under current scaling)."""

    def dense(slot, x, kernel, bias):
        if recipe is None:
            return _bf16_dense(x, kernel, bias)
        state = None if states is None else states[slot]
        return fj.dense(x, kernel, bias, state=state, recipe=recipe)

    x = params["embed"][ctx].reshape(ctx.shape[0], -1)  # float32 residual stream
    for i, blk in enumerate(params["blocks"]):
        h = _layer_norm(x, blk["ln_scale"], blk["ln_bias"])
        u = dense(2 * i, h, blk["up_kernel"], blk["up_bias"])
        g = jax.nn.gelu(u, approximate=True)
        x = x + dense(2 * i + 1, g, blk["down_kernel"], blk["down_bias"]).astype(jnp.float32)
    h = _layer_norm(x, params["ln_f_scale"], params["ln_f_bias"])
    return _bf16_dense(h, params["head_kernel"], params["head_bias"]).astype(jnp.float32)


def _cross_entropy(logits, tgt):
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, tgt[:, None], axis=-1).mean()


def _adam(params, grads, opt, lr):
    step, m, v = opt
    step = step + 1
    m = jax.tree.map(lambda a, g: ADAM_B1 * a + (1 - ADAM_B1) * g, m, grads)
    v = jax.tree.map(lambda a, g: ADAM_B2 * a + (1 - ADAM_B2) * g * g, v, grads)
    c1 = 1 - ADAM_B1 ** step
    c2 = 1 - ADAM_B2 ** step
    params = jax.tree.map(lambda p, a, b: p - lr * (a / c1) / (jnp.sqrt(b / c2) + ADAM_EPS),
                          params, m, v)
    return params, (step, m, v)


def default_device(cpu: bool = False):
    return jax.devices("cpu")[0] if cpu else jax.devices()[0]


def train(cfg: Config, data: Data, params_np: dict, recipe, progress, device=None) -> RunResult:
    """One run; recipe None trains in bf16. progress(step, loss) is called
    every step with the loss as a Python float (it decides what to print)."""
    device = device or default_device()
    with jax.default_device(device):
        return _train(cfg, data, params_np, recipe, progress, device)


def _train(cfg, data, params_np, recipe, progress, device) -> RunResult:
    t0 = time.perf_counter()
    params = jax.device_put(jax.tree.map(jnp.asarray, params_np), device)
    delayed = isinstance(recipe, recipe_lib.DelayedScaling)
    states = ([fj.DelayedScalingState.create(recipe) for _ in range(2 * cfg.blocks)]
              if delayed else None)
    opt = jax.device_put((jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params),
                          jax.tree.map(jnp.zeros_like, params)), device)
    states = jax.device_put(states, device)

    def loss_fn(p, s, ctx, tgt):
        return _cross_entropy(_logits(p, s, ctx, recipe), tgt)

    @jax.jit
    def step(p, s, o, ctx, tgt):
        if delayed:
            loss, (grads, s) = jax.value_and_grad(loss_fn, argnums=(0, 1))(p, s, ctx, tgt)
        else:
            loss, grads = jax.value_and_grad(loss_fn)(p, s, ctx, tgt)
        p, o = _adam(p, grads, o, cfg.lr)
        return p, s, o, loss

    losses = []
    for i in range(cfg.steps):
        params, states, opt, loss = step(params, states, opt, data.train_ctx[i],
                                         data.train_tgt[i])
        losses.append(float(loss))  # syncs each step: the progress line is live
        progress(i + 1, losses[-1])

    logits_fn = jax.jit(lambda p, s, ctx: _logits(p, s, ctx, recipe))
    val_loss = float(_cross_entropy(logits_fn(params, states, data.val_ctx),
                                    jnp.asarray(data.val_tgt)))
    seconds = time.perf_counter() - t0
    return RunResult(framework="jax", precision="bf16" if recipe is None else "fp8",
                     device=str(device.platform), losses=losses, val_loss=val_loss,
                     seconds=seconds,
                     logits_fn=lambda ctx: np.asarray(logits_fn(params, states, ctx)))
