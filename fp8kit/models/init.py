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

A mixture-of-experts config (experts = E > 0) gives every layer a
"router" [hidden, E] and each MLP kernel a leading expert dimension:
"w_gate", "w_up" [E, hidden, ffn], "w_down" [E, ffn, hidden]; fused
kernels concatenate along the last axis, so "w_gate_up" is [E, hidden,
2 * ffn].
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
# The FP8 model's fused kernels, each the concatenation along its outputs
# of these kernels (fuse_kernels), in this order.
FUSED_KERNELS = {"wqkv": ("wq", "wk", "wv"), "w_gate_up": ("w_gate", "w_up")}
UNFUSED_KERNELS = sum(FUSED_KERNELS.values(), ())


# Normal draws are made this many at a time (normal_float32).
_CHUNK = 1 << 20


def normal_float32(rng: np.random.Generator, shape, std: float) -> np.ndarray:
    """rng.normal(0.0, std, size=shape).astype(np.float32), the same bits
    and the same generator state after, drawn a chunk at a time into one
    reused float64 buffer: the one-shot form's float64 array (twice the
    result's size, then a converting copy) cost the host minutes for the
    2.9B parameters of mixtral_slice, most of it in touching fresh memory."""
    out = np.empty(shape, np.float32)
    flat = out.reshape(-1)
    buf = np.empty(min(_CHUNK, flat.size), np.float64)
    for start in range(0, flat.size, _CHUNK):
        chunk = buf[:min(_CHUNK, flat.size - start)]
        rng.standard_normal(out=chunk)   # normal(0, std) is 0 + std * these, in float64
        chunk *= std
        flat[start:start + chunk.size] = chunk
    return out


def init_params(cfg: LlamaConfig, seed: int) -> dict:
    """float32 NumPy weights, deterministic in (cfg, seed)."""
    rng = np.random.default_rng(seed)
    d, kv, f = cfg.hidden, cfg.kv_width, cfg.ffn
    residual_std = cfg.init_std / math.sqrt(2 * cfg.layers)

    def normal(shape, std=cfg.init_std):
        return normal_float32(rng, shape, std)

    params = {"embed": normal((cfg.vocab, d)), "layers": []}
    for _ in range(cfg.layers):
        experts = (cfg.experts,) if cfg.experts else ()
        shapes = {"wq": (d, d), "wk": (d, kv), "wv": (d, kv), "wo": (d, d),
                  "w_gate": experts + (d, f), "w_up": experts + (d, f),
                  "w_down": experts + (f, d)}
        if cfg.experts:
            shapes["router"] = (d, cfg.experts)
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
    for name, parts in FUSED_KERNELS.items():
        fused[name] = np.concatenate([layer[p] for p in parts], axis=-1)
    return fused


def output_width(cfg: LlamaConfig, name: str) -> int:
    """The output width of kernel `name` of init's layout."""
    return {"wq": cfg.hidden, "wk": cfg.kv_width, "wv": cfg.kv_width,
            "w_gate": cfg.ffn, "w_up": cfg.ffn}[name]


def split_kernel(kernel: np.ndarray, parts: tuple, cfg: LlamaConfig) -> dict:
    """A fused kernel [..., in, sum of widths] (or a moment of it) as its
    parts {name: [..., in, width]}: fuse_kernels' inverse for one kernel."""
    bounds = np.cumsum([output_width(cfg, p) for p in parts])[:-1]
    return dict(zip(parts, np.split(kernel, bounds, axis=-1)))


def unfuse_kernels(layer: dict, cfg: LlamaConfig) -> dict:
    """fuse_kernels' inverse: one layer in init's layout."""
    out = {k: v for k, v in layer.items() if k not in FUSED_KERNELS}
    for name, parts in FUSED_KERNELS.items():
        out.update(split_kernel(layer[name], parts, cfg))
    return out


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
