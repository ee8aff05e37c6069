"""The decoder's mixture-of-experts MLP in JAX, the same block as
moe_torch.py (see there): an RMSNorm, a float32 router choosing top_k of
E SwiGLU experts per token (weights: the softmax of those k scores), the
(token, expert) pairs sorted by expert, the experts as grouped GEMMs and
the outputs summed with the router's weights, and the block's
load-balancing loss (load_balancing_loss, moe_torch.py's).

With a recipe the experts run through fp8kit.jax.grouped_dense (every
recipe: one scale per expert and operand, or per block) on the kernels cast
to bf16 first, as torch.autocast casts the PyTorch model's weights; with
recipe=None through jax.lax.ragged_dot in bf16. Static shapes throughout
(the pairs are tokens * top_k, the counts an [E] array), so the block
runs under jit with no host read of its own. Expert parallel inside
jax.shard_map: moe_mlp's expert_axis.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import fp8kit.jax as fj
from fp8kit.models.config import LlamaConfig

BF16, F32 = jnp.bfloat16, jnp.float32


def route(scores, top_k: int, balanced: bool = False):
    """(expert of each pair sorted by expert, its token, its weight, the
    int32 number of pairs per expert) for router scores [tokens, E];
    balanced: round-robin experts, as moe_torch.route."""
    tokens, experts = scores.shape
    if balanced:
        top_experts = jnp.arange(tokens * top_k, dtype=jnp.int32).reshape(tokens, top_k) % experts
        top_scores = jnp.take_along_axis(scores, top_experts, axis=1)
    else:
        top_scores, top_experts = jax.lax.top_k(scores, top_k)
    weights = jax.nn.softmax(top_scores, axis=-1)
    flat = top_experts.reshape(-1)
    order = jnp.argsort(flat, stable=True)  # stable: ties keep the token order
    counts = jnp.bincount(flat, length=experts).astype(jnp.int32)
    return flat[order], order // top_k, weights.reshape(-1)[order], counts


def load_balancing_loss(scores, counts, top_k: int, axis_name=None):
    """E * sum_e f_e * P_e (moe_torch.py's docstring) for router scores
    [tokens, E] and route()'s counts: a float32 scalar, computed operation
    for operation as moe_torch.load_balancing_loss computes it.
    axis_name: the scores are this device's share of the tokens inside
    jax.shard_map over that mesh axis; f and P are then the whole batch's
    (the counts and the probabilities' sums summed over the axis), so every
    device returns the value of the unsharded batch."""
    tokens, experts = scores.shape
    counts = jax.lax.stop_gradient(counts).astype(F32)
    prob_sum = jax.nn.softmax(scores.astype(F32), axis=-1).sum(0)
    if axis_name is not None:
        counts, prob_sum = jax.lax.psum((counts, prob_sum), axis_name)
        tokens *= jax.lax.axis_size(axis_name)
    f = counts / (tokens * top_k)
    p = prob_sum / tokens
    return jnp.sum(f * p) * experts


def _experts(x, kernel, counts, recipe, state=None, statistics=None):
    """x [pairs, in] @ each expert's kernel [E, in, out] over its pairs;
    statistics: the call's statistics rows, or None. The FP8 layer takes
    the float32 kernel as it is (one rounding, no bf16 copy of every
    expert's kernel each step), as project() hands the dense layers theirs."""
    if recipe is None:
        return jax.lax.ragged_dot(x, kernel.astype(BF16), counts)
    return fj.grouped_dense(x, kernel, counts, state=state, recipe=recipe, statistics=statistics)


def moe_mlp(p, h, cfg: LlamaConfig, recipe, states=None, expert_axis=None, capacity=None,
            statistics=None):
    """(the experts' output for the normalized input h (bf16 [..., hidden]),
    bf16 in h's shape; the block's load_balancing_loss, float32). p: the
    layer's params (model_params' layout: "w_gate_up" fused with a recipe,
    "w_gate" and "w_up" without); states: under DelayedScaling {"gate_up",
    "down": GroupedDelayedScalingState}, else None; statistics: None, or
    {"gate_up", "down": fp8kit.jax.statistics_rows(1)}, whose cotangents
    are then the two grouped layers' cast statistics (not with
    expert_axis).

    expert_axis: run expert parallel inside jax.shard_map over that mesh
    axis (fp8kit.jax.expert_parallel): h is this device's share of the
    tokens, the router replicated, the expert kernels and states this
    device's E / D experts; each device sends each expert at most
    `capacity` of its (token, expert) pairs (default: all of them, so none
    is dropped and the result is the unsharded block's). The
    load-balancing loss is then the whole batch's, the same on every
    device (a replicated output)."""
    shape = h.shape
    h = h.reshape(-1, cfg.hidden)
    scores = jnp.dot(h.astype(F32), p["router"].astype(F32))
    expert, token, weight, counts = route(scores, cfg.top_k, cfg.router_balanced)
    aux = load_balancing_loss(scores, counts, cfg.top_k, expert_axis)
    pairs = h[token]
    plan = None
    if expert_axis is not None:
        pairs, plan = fj.expert_parallel.dispatch(
            pairs, expert, num_experts=scores.shape[-1], axis_name=expert_axis,
            capacity=pairs.shape[0] if capacity is None else capacity)
        counts = plan.group_sizes
    if recipe is None:
        gate = _experts(pairs, p["w_gate"], counts, None).astype(F32)
        up = _experts(pairs, p["w_up"], counts, None).astype(F32)
    else:
        gate_up = _experts(pairs, p["w_gate_up"], counts, recipe, _of(states, "gate_up"),
                           _of(statistics, "gate_up")).astype(F32)
        gate, up = jnp.split(gate_up, 2, axis=-1)
    out = _experts((jax.nn.silu(gate) * up).astype(BF16), p["w_down"], counts, recipe,
                   _of(states, "down"), _of(statistics, "down"))
    if plan is not None:
        out = fj.expert_parallel.combine(out, plan)
    y = jnp.zeros(h.shape, F32).at[token].add(out.astype(F32) * weight[:, None])
    return y.astype(BF16).reshape(shape), aux


def _of(tree, name):
    """tree[name], or None for no tree."""
    return None if tree is None else tree[name]
