"""The Llama-style decoder in PyTorch.

    tokens -> embed -> layers x [x + attention(x), x + mlp(x)] -> RMSNorm -> lm_head

Precision: parameters are float32 (the optimizer's master weights); the
forward computes in bf16 under torch.autocast, which casts each weight to
bf16 as a projection reads it. The residual stream, the norms' statistics
and the rotary rotation stay in float32; attention runs in bf16
(scaled_dot_product_attention, causal). With a recipe, the seven
projections of every layer (q, k, v, o, gate, up, down) are
fp8kit.torch.Linear layers run under fp8kit.torch.autocast(recipe); with
recipe=None they are torch.nn.Linear and the model contains no fp8kit
layer. fp8kit/models/llama_jax.py is the same model in JAX.

Two modules are the seams for fused layers: NormQKV (the attention's
input norm and its q, k, v projections: a LayerNormLinear) and NormMLP
(the MLP's input norm and the whole SwiGLU MLP: a LayerNormMLP).
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.nn.functional as F

import fp8kit.torch as ft
from fp8kit.models.config import LlamaConfig
from fp8kit.models.init import rope_tables

BF16 = torch.bfloat16


def _linear(in_features: int, out_features: int, fp8: bool, device) -> torch.nn.Linear:
    cls = ft.Linear if fp8 else torch.nn.Linear
    return cls(in_features, out_features, bias=False, device=device)


class RMSNorm(torch.nn.Module):
    """x / rms(x) * weight in float32, returned in bf16 (the projections' input)."""

    def __init__(self, dim: int, eps: float, device=None):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x * self.weight).to(BF16)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [batch, heads, seq, head_dim] ("rotate half"
    form, fp8kit/models/init.py), computed in float32, returned in bf16."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(BF16)


class NormQKV(torch.nn.Module):
    """RMSNorm, then the q, k and v projections of the normed input."""

    def __init__(self, cfg: LlamaConfig, fp8: bool, device=None):
        super().__init__()
        self.norm = RMSNorm(cfg.hidden, cfg.norm_eps, device)
        self.wq = _linear(cfg.hidden, cfg.hidden, fp8, device)
        self.wk = _linear(cfg.hidden, cfg.kv_width, fp8, device)
        self.wv = _linear(cfg.hidden, cfg.kv_width, fp8, device)

    def forward(self, x):
        h = self.norm(x)
        return self.wq(h), self.wk(h), self.wv(h)


class Attention(torch.nn.Module):
    def __init__(self, cfg: LlamaConfig, fp8: bool, device=None):
        super().__init__()
        self.cfg = cfg
        self.qkv = NormQKV(cfg, fp8, device)
        self.wo = _linear(cfg.hidden, cfg.hidden, fp8, device)

    def forward(self, x, cos, sin):
        cfg, (b, s, _) = self.cfg, x.shape
        q, k, v = self.qkv(x)
        q = q.view(b, s, cfg.heads, cfg.head_dim).transpose(1, 2)
        k = k.view(b, s, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
        v = v.view(b, s, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=cfg.num_kv_heads != cfg.heads)
        return self.wo(o.transpose(1, 2).reshape(b, s, cfg.hidden))


class NormMLP(torch.nn.Module):
    """RMSNorm, then the SwiGLU MLP: down(silu(gate(h)) * up(h))."""

    def __init__(self, cfg: LlamaConfig, fp8: bool, device=None):
        super().__init__()
        self.norm = RMSNorm(cfg.hidden, cfg.norm_eps, device)
        self.w_gate = _linear(cfg.hidden, cfg.ffn, fp8, device)
        self.w_up = _linear(cfg.hidden, cfg.ffn, fp8, device)
        self.w_down = _linear(cfg.ffn, cfg.hidden, fp8, device)

    def forward(self, x):
        h = self.norm(x)
        g = F.silu(self.w_gate(h).float()) * self.w_up(h).float()
        return self.w_down(g.to(BF16))


class DecoderLayer(torch.nn.Module):
    def __init__(self, cfg: LlamaConfig, fp8: bool, device=None):
        super().__init__()
        self.attention = Attention(cfg, fp8, device)
        self.mlp = NormMLP(cfg, fp8, device)

    def forward(self, x, cos, sin):
        x = x + self.attention(x, cos, sin)   # float32 + bf16: the stream stays float32
        return x + self.mlp(x)


class Llama(torch.nn.Module):
    """recipe: an fp8kit.recipe (FP8 projections) or None (all bf16)."""

    def __init__(self, cfg: LlamaConfig, recipe=None, device=None):
        super().__init__()
        self.cfg, self.recipe = cfg, recipe
        fp8 = recipe is not None
        self.embed = torch.nn.Embedding(cfg.vocab, cfg.hidden, device=device)
        self.layers = torch.nn.ModuleList(DecoderLayer(cfg, fp8, device)
                                          for _ in range(cfg.layers))
        self.final_norm = RMSNorm(cfg.hidden, cfg.norm_eps, device)
        # The output head stays in bf16 (a torch.nn.Linear even with a
        # recipe), as FP8 training recipes usually keep it: its outputs are
        # the logits of a softmax over the whole vocabulary, and FP8 there
        # measurably hurts the loss.
        self.lm_head = torch.nn.Linear(cfg.hidden, cfg.vocab, bias=False, device=device)
        cos, sin = (torch.from_numpy(t) for t in rope_tables(cfg))
        self.register_buffer("rope_cos", cos.to(device), persistent=False)
        self.register_buffer("rope_sin", sin.to(device), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens int64 [batch, seq] -> float32 logits [batch, seq, vocab]."""
        s = tokens.shape[1]
        if s > self.cfg.seq_len:
            raise ValueError(f"Llama: sequence of {s} tokens is longer than the config's "
                             f"seq_len={self.cfg.seq_len}")
        cos, sin = self.rope_cos[:s], self.rope_sin[:s]
        fp8 = (ft.autocast(recipe=self.recipe) if self.recipe is not None
               else contextlib.nullcontext())
        with torch.autocast(tokens.device.type, dtype=BF16), fp8:
            x = self.embed(tokens)
            for layer in self.layers:
                x = layer(x, cos, sin)
            return self.lm_head(self.final_norm(x)).float()


def load_params(model: Llama, params: dict) -> None:
    """Copies NumPy weights in fp8kit/models/init.py's layout into `model`:
    the one place where a kernel [in, out] becomes a weight [out, in]."""
    def put(param, value, kernel=False):
        value = np.ascontiguousarray(value.T if kernel else value)
        if tuple(param.shape) != value.shape:
            raise ValueError(f"load_params: weight of shape {value.shape} does not fit "
                             f"parameter of shape {tuple(param.shape)}; wrong config?")
        with torch.no_grad():
            param.copy_(torch.from_numpy(value))

    if len(params["layers"]) != len(model.layers):
        raise ValueError(f"load_params: {len(params['layers'])} layers of weights for a model "
                         f"of {len(model.layers)}")
    put(model.embed.weight, params["embed"])
    for layer, p in zip(model.layers, params["layers"]):
        attn, mlp = layer.attention, layer.mlp
        put(attn.qkv.norm.weight, p["attn_norm"])
        for name in ("wq", "wk", "wv"):
            put(getattr(attn.qkv, name).weight, p[name], kernel=True)
        put(attn.wo.weight, p["wo"], kernel=True)
        put(mlp.norm.weight, p["mlp_norm"])
        for name in ("w_gate", "w_up", "w_down"):
            put(getattr(mlp, name).weight, p[name], kernel=True)
    put(model.final_norm.weight, params["final_norm"])
    put(model.lm_head.weight, params["lm_head"], kernel=True)
