"""What the demo trains, framework-free: the model's sizes, its initial
weights and the batches, as NumPy arrays that both the JAX and the PyTorch
runs load, so all four runs (FP8 and bf16 in each framework) start from the
same weights and see the same characters in the same order.

The model is a character-level language model built from transformer MLP
blocks: the embeddings of the previous `context` characters are
concatenated into one d_model-wide vector, then each block computes

    x = x + down(gelu(up(layer_norm(x))))          (up: d -> hidden, down: hidden -> d)

and a final layer norm and output head give the next character's logits.
The up and down projections are the FP8 layers (fp8kit.jax.dense /
fp8kit.torch.Linear); embeddings, layer norms and the small output head
stay in bf16 in both runs, as FP8 training recipes usually keep them, so
the FP8 and bf16 runs differ only in the FP8 layers. FP8 GEMMs need the
layers' feature sizes, d_model and hidden, to be multiples of 16; the batch
(the token count) may be any size.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from fp8kit.demo import text


@dataclasses.dataclass(frozen=True)
class Config:
    context: int = 8        # previous characters the model sees
    embed: int = 16         # embedding width per character; d_model = context * embed
    hidden: int = 256       # MLP width
    blocks: int = 2         # MLP blocks
    batch: int = 128        # tokens per step
    steps: int = 200
    lr: float = 3e-3        # Adam
    seed: int = 0

    @property
    def d_model(self) -> int:
        return self.context * self.embed

    @property
    def vocab(self) -> int:
        return len(text.ALPHABET)

    def check(self) -> None:
        for name in ("d_model", "hidden"):
            v = getattr(self, name)
            if v <= 0 or v % 16 != 0:
                raise ValueError(f"{name}={v} must be a positive multiple of 16 (FP8 GEMM "
                                 "alignment); change --embed/--context or --hidden")
        if self.batch < 1:
            raise ValueError(f"batch={self.batch} must be >= 1")
        if self.steps < 1:
            raise ValueError(f"steps={self.steps} must be >= 1")


@dataclasses.dataclass(frozen=True)
class Data:
    train_ctx: np.ndarray   # int32 [steps, batch, context]
    train_tgt: np.ndarray   # int32 [steps, batch]
    val_ctx: np.ndarray     # int32 [n_val, context]
    val_tgt: np.ndarray     # int32 [n_val]


def _windows(tokens: np.ndarray, ends: np.ndarray, context: int):
    """Context windows (the `context` characters before each end) and targets."""
    ctx = tokens[ends[..., None] - context + np.arange(context)]
    return ctx.astype(np.int32), tokens[ends].astype(np.int32)


def make_data(cfg: Config, n_val: int = 2048) -> Data:
    # Train and validation text come from disjoint RNG streams.
    train = text.encode(text.generate(200_000, seed=cfg.seed))
    val = text.encode(text.generate(40_000, seed=cfg.seed + 1_000_003))
    rng = np.random.default_rng(cfg.seed)
    ends = rng.integers(cfg.context, len(train), size=(cfg.steps, cfg.batch))
    train_ctx, train_tgt = _windows(train, ends, cfg.context)
    val_ends = np.random.default_rng(cfg.seed + 1).integers(cfg.context, len(val), size=n_val)
    val_ctx, val_tgt = _windows(val, val_ends, cfg.context)
    return Data(train_ctx, train_tgt, val_ctx, val_tgt)


def init_params(cfg: Config) -> dict:
    """Initial weights (float32). Kernels are [in, out] (JAX's layout; the
    PyTorch run transposes them into nn.Linear's [out, in])."""
    rng = np.random.default_rng(cfg.seed + 7)
    d, h, v = cfg.d_model, cfg.hidden, cfg.vocab

    def uniform(fan_in, shape, gain=1.0):
        bound = gain / math.sqrt(fan_in)
        return rng.uniform(-bound, bound, size=shape).astype(np.float32)

    params = {
        "embed": rng.normal(0.0, 1.0, size=(v, cfg.embed)).astype(np.float32),
        "blocks": [],
        "ln_f_scale": np.ones(d, np.float32),
        "ln_f_bias": np.zeros(d, np.float32),
        "head_kernel": uniform(d, (d, v)),
        "head_bias": np.zeros(v, np.float32),
    }
    for _ in range(cfg.blocks):
        params["blocks"].append({
            "ln_scale": np.ones(d, np.float32),
            "ln_bias": np.zeros(d, np.float32),
            "up_kernel": uniform(d, (d, h)),
            "up_bias": np.zeros(h, np.float32),
            # Smaller residual branches at the start keep the stream stable.
            "down_kernel": uniform(h, (h, d), gain=1.0 / math.sqrt(2 * cfg.blocks)),
            "down_bias": np.zeros(d, np.float32),
        })
    return params


def uniform_guess_loss(cfg: Config) -> float:
    """Cross-entropy of predicting every character with equal probability."""
    return math.log(cfg.vocab)
