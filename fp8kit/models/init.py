"""The decoder's initial weights and rotary tables, made once with NumPy so
that the PyTorch and the JAX model start from the same numbers.

Initialization (GPT-2's, as most Llama training code uses): every weight
matrix, the embedding and the output head drawn from normal(0, init_std);
the two projections that write into the residual stream (attention's o and
the MLP's down) scaled by 1 / sqrt(2 * layers), so that the stream's
variance does not grow with depth; RMSNorm gains at 1.

Layout: JAX's. A kernel is [in, out] (y = x @ kernel); the PyTorch model
transposes kernels into torch.nn.Linear's [out, in] weight in one place,
llama_torch.load_params. The FP8 model's fused layers take the q, k, v
kernels and the gate, up kernels concatenated along their outputs;
fuse_kernels makes those concatenations for both frameworks.

    {"embed": [vocab, hidden],
     "layers": [{"attn_norm": [hidden], "wq": [hidden, hidden],
                 "wk": [hidden, kv_width], "wv": [hidden, kv_width],
                 "wo": [hidden, hidden], "mlp_norm": [hidden],
                 "w_gate": [hidden, ffn], "w_up": [hidden, ffn],
                 "w_down": [ffn, hidden]}, ...],
     "final_norm": [hidden], "lm_head": [hidden, vocab]}
"""

from __future__ import annotations

import math

import numpy as np

from fp8kit.models.config import LlamaConfig

# The projections of a layer, in the order they run; each runs in FP8 with a
# recipe (the q, k, v and the gate, up, down ones inside fused layers).
PROJECTIONS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
# Those that write into the residual stream (scaled down at init).
RESIDUAL_OUTPUTS = ("wo", "w_down")
# Those that the FP8 model's fused layers take concatenated (fuse_kernels).
UNFUSED_KERNELS = ("wq", "wk", "wv", "w_gate", "w_up")


def init_params(cfg: LlamaConfig, seed: int) -> dict:
    """float32 NumPy weights, deterministic in (cfg, seed)."""
    rng = np.random.default_rng(seed)
    d, kv, f = cfg.hidden, cfg.kv_width, cfg.ffn
    residual_std = cfg.init_std / math.sqrt(2 * cfg.layers)

    def normal(shape, std=cfg.init_std):
        return rng.normal(0.0, std, size=shape).astype(np.float32)

    params = {"embed": normal((cfg.vocab, d)), "layers": []}
    for _ in range(cfg.layers):
        shapes = {"wq": (d, d), "wk": (d, kv), "wv": (d, kv), "wo": (d, d),
                  "w_gate": (d, f), "w_up": (d, f), "w_down": (f, d)}
        layer = {name: normal(shape, residual_std if name in RESIDUAL_OUTPUTS else cfg.init_std)
                 for name, shape in shapes.items()}
        layer["attn_norm"] = np.ones(d, np.float32)
        layer["mlp_norm"] = np.ones(d, np.float32)
        params["layers"].append(layer)
    params["final_norm"] = np.ones(d, np.float32)
    params["lm_head"] = normal((d, cfg.vocab))
    return params


def fuse_kernels(layer: dict) -> dict:
    """One layer's weights as the FP8 model's fused layers take them:
    "wqkv" [hidden, hidden + 2 * kv_width] = [wq | wk | wv] (the
    LayerNormLinear of the norm and the q, k, v projections) and
    "w_gate_up" [hidden, 2 * ffn] = [w_gate | w_up] (SwiGLU's fc1 in the
    LayerNormMLP, the gate first), the other weights as they are."""
    fused = {k: v for k, v in layer.items() if k not in UNFUSED_KERNELS}
    fused["wqkv"] = np.concatenate([layer["wq"], layer["wk"], layer["wv"]], axis=1)
    fused["w_gate_up"] = np.concatenate([layer["w_gate"], layer["w_up"]], axis=1)
    return fused


def rope_tables(cfg: LlamaConfig) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin: float32 [seq_len, head_dim // 2], computed in float64.

    Rotary embedding in the "rotate half" form: feature i of the first
    half and feature i of the second half of each head form a pair, rotated
    by the angle position * rope_theta ** (-2i / head_dim).
    """
    half = cfg.head_dim // 2
    inv_freq = cfg.rope_theta ** (-np.arange(half, dtype=np.float64) * 2 / cfg.head_dim)
    angles = np.arange(cfg.seq_len, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
