"""The decoder's mixture-of-experts MLP in PyTorch (Mixtral's block): an
RMSNorm, a router choosing top_k of E SwiGLU experts per token, the
experts as two fp8kit.torch.GroupedLinear layers, and the outputs summed
with the router's weights.

    h = norm(x);  p = softmax(h @ router)                   (float32)
    each token t goes to its top_k experts e with weight p[t, e] / sum of
    those top_k weights; the (token, expert) pairs are sorted by expert and
    each expert runs down(silu(gate(h_t)) * up(h_t)) on its pairs;
    y[t] = sum over its experts of weight * expert output.

The router stays in float32 (as MoE training code keeps it: its scores
pick the experts, and a rounding flip changes a token's route). The
experts run in FP8 inside fp8kit.torch.autocast (one scale per expert
and operand: CurrentScaling's from its amax, DelayedScaling's from its
own history), else in bf16 like the dense model's MLP.
The group sizes are counted on the device and read to the host once per
block (the grouped GEMMs are planned on the host, fp8kit/grouped.h).

Each block also returns its load-balancing loss, Switch Transformer's
(Hugging Face's Mixtral adds it too): E * sum_e f_e * P_e, with f_e the
fraction of the (token, slot) assignments routed to expert e (the top_k
choices, no gradient) and P_e the mean router probability of e (the
softmax over all E scores, float32). It is 1 when the tokens are spread
evenly and grows as they crowd onto fewer experts; the trainers add
LlamaConfig.router_aux_loss_coef times its sum over the layers to the
language model's loss. (Hugging Face's sums f over the top_k slots where
this averages: its value is top_k times this one.) docs/moe.md gives
what it does to the routing of moe_tiny and of mixtral_slice's width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import fp8kit.torch as ft
from fp8kit.models.config import LlamaConfig

BF16 = torch.bfloat16


def route(scores: torch.Tensor, top_k: int, balanced: bool = False):
    """(expert of each pair sorted by expert, its token, its weight, the
    number of pairs per expert) for router scores [tokens, E]: each token's
    top_k experts, the weights its softmax over those k scores (Mixtral's
    rule, equal to renormalizing the top_k probabilities). balanced: the
    experts round-robin instead (LlamaConfig.router_balanced), weighed by
    their scores alike."""
    tokens, experts = scores.shape
    if balanced:
        slots = torch.arange(tokens * top_k, device=scores.device).reshape(tokens, top_k)
        top_experts = slots % experts
        top_scores = scores.gather(1, top_experts)
    else:
        top_scores, top_experts = scores.topk(top_k, dim=-1)
    weights = F.softmax(top_scores, dim=-1)
    flat = top_experts.reshape(-1)
    order = torch.argsort(flat, stable=True)  # stable: ties keep the token order
    counts = torch.bincount(flat, minlength=experts)
    return flat[order], order // top_k, weights.reshape(-1)[order], counts


def load_balancing_loss(scores: torch.Tensor, counts: torch.Tensor, top_k: int) -> torch.Tensor:
    """E * sum_e f_e * P_e (the module's docstring) for router scores
    [tokens, E] and route()'s counts of pairs per expert: a float32 scalar,
    differentiable in the scores (the counts carry no gradient).
    moe_jax.load_balancing_loss computes it operation for operation alike."""
    tokens, experts = scores.shape
    f = counts.float() / (tokens * top_k)
    p = torch.softmax(scores.float(), dim=-1).sum(0) / tokens
    return (f * p).sum() * experts


class MoEMLP(torch.nn.Module):
    """RMSNorm, router, E SwiGLU experts; takes [batch, seq, hidden], returns
    the output in that shape and the block's load-balancing loss."""

    def __init__(self, cfg: LlamaConfig, norm: torch.nn.Module, device=None):
        super().__init__()
        self.cfg = cfg
        self.norm = norm
        self.router = torch.nn.Linear(cfg.hidden, cfg.experts, bias=False, device=device)
        # fc1's rows per expert are [gate; up], as LayerNormMLP's fc1.
        self.w_gate_up = ft.GroupedLinear(cfg.experts, cfg.hidden, 2 * cfg.ffn, bias=False,
                                          device=device)
        self.w_down = ft.GroupedLinear(cfg.experts, cfg.ffn, cfg.hidden, bias=False,
                                       device=device)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the experts' output, the block's load_balancing_loss)."""
        shape = x.shape
        h = self.norm(x).reshape(-1, self.cfg.hidden)
        with torch.autocast(x.device.type, enabled=False):
            scores = F.linear(h.float(), self.router.weight.float())
        expert, token, weight, counts = route(scores, self.cfg.top_k, self.cfg.router_balanced)
        aux = load_balancing_loss(scores, counts, self.cfg.top_k)
        out = self.experts(h[token], expert, counts)
        y = torch.zeros(h.shape, dtype=torch.float32, device=h.device)
        y.index_add_(0, token, out.float() * weight[:, None])
        return y.to(BF16).reshape(shape), aux

    def experts(self, pairs: torch.Tensor, expert: torch.Tensor,
                counts: torch.Tensor) -> torch.Tensor:
        """Each expert's SwiGLU MLP over its pairs: pairs [pairs, hidden],
        the normed tokens sorted by expert, route()'s expert and counts
        (on the device); returns [pairs, hidden]."""
        # The grouped GEMMs are planned on the host: one read of the counts
        # here serves every grouped call of the block, forward and backward
        # (ten in FP8), where counts left on the GPU would be read by each.
        return self.swiglu(pairs, counts.cpu())

    def swiglu(self, x: torch.Tensor, counts) -> torch.Tensor:
        """down(silu(gate(x)) * up(x)), each expert's weights over its rows
        (counts: the rows per expert, as the grouped layers take them)."""
        gate, up = self.w_gate_up(x, counts).float().chunk(2, dim=-1)
        return self.w_down((F.silu(gate) * up).to(x.dtype), counts)
