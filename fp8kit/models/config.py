"""The Llama-style decoder's shape, one frozen dataclass shared by the
PyTorch and the JAX model, and the named configurations.

A config is a value: hashable (safe to close over in jax.jit), checked at
construction. Every projection that runs through fp8kit (q, k, v, o, gate,
up, down) has both feature sizes a multiple of 16, the FP8 GEMM's
alignment, so hidden, ffn and heads * head_dim must be multiples of 16.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

# cuBLASLt's FP8 GEMM alignment (the extensions' GEMM_DIM_MULTIPLE; kept as
# a plain number so that this module imports no extension).
FP8_DIM_MULTIPLE = 16


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    vocab: int = 256            # byte-level tokens
    hidden: int = 128           # model width
    layers: int = 2
    heads: int = 4              # query heads; head_dim = hidden // heads
    kv_heads: int = 0           # key/value heads (grouped-query attention); 0: = heads
    ffn: int = 352              # SwiGLU width
    seq_len: int = 128          # the longest sequence (rotary tables are this long)
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    init_std: float = 0.02      # see fp8kit/models/init.py
    # Mixture of experts: 0 keeps the dense SwiGLU MLP; E > 0 makes every
    # layer's MLP E SwiGLU experts of width ffn, each token routed to the
    # top_k experts its router scores highest (fp8kit/models/moe_torch.py).
    experts: int = 0
    top_k: int = 2
    # The load-balancing loss of a mixture-of-experts config (moe_torch.py's
    # load_balancing_loss, 1 per layer when the experts share the tokens
    # evenly): the training loss adds this coefficient times its sum over
    # the layers; 0 leaves it out. A dense config has no such term.
    router_aux_loss_coef: float = 0.01
    # For benchmarks only: each token's top_k experts are chosen round-robin
    # (token t's slot j goes to expert (t * top_k + j) mod E) instead of by
    # its scores, so every expert gets the same share however the router
    # has trained; the router's scores still weigh the outputs. A router
    # that collapsed onto one expert would time that expert's GEMM doing
    # every token's work (Megatron-LM's benchmarks force balance alike).
    router_balanced: bool = False

    def __post_init__(self):
        for name in ("vocab", "hidden", "layers", "heads", "ffn", "seq_len"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"LlamaConfig.{name} must be an int >= 1, got {v!r}")
        if self.hidden % self.heads:
            raise ValueError(f"LlamaConfig.hidden={self.hidden} must be a multiple of "
                             f"heads={self.heads}")
        if self.head_dim % 2:
            raise ValueError(f"LlamaConfig: head_dim = hidden / heads = {self.head_dim} must "
                             "be even (rotary embeddings rotate pairs of features)")
        if self.kv_heads < 0 or self.heads % self.num_kv_heads:
            raise ValueError(f"LlamaConfig.kv_heads={self.kv_heads} must divide "
                             f"heads={self.heads} (0 means kv_heads = heads)")
        for name in ("hidden", "ffn", "kv_width"):
            v = getattr(self, name)
            if v % FP8_DIM_MULTIPLE:
                raise ValueError(f"LlamaConfig: {name}={v} must be a multiple of "
                                 f"{FP8_DIM_MULTIPLE} (the FP8 GEMM's alignment)")
        for name in ("experts", "top_k"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"LlamaConfig.{name} must be an int >= 0, got {v!r}")
        if self.experts and not 1 <= self.top_k <= self.experts:
            raise ValueError(f"LlamaConfig.top_k={self.top_k} must be in [1, experts="
                             f"{self.experts}] (each token goes to top_k of the experts)")
        coef = self.router_aux_loss_coef
        if (isinstance(coef, bool) or not isinstance(coef, numbers.Real)
                or not math.isfinite(coef) or coef < 0):
            raise ValueError(f"LlamaConfig.router_aux_loss_coef must be a finite float >= 0 "
                             f"(0: no load-balancing loss), got {coef!r}")
        object.__setattr__(self, "router_aux_loss_coef", float(coef))
        if not isinstance(self.router_balanced, bool):
            raise ValueError(f"LlamaConfig.router_balanced must be a bool, got "
                             f"{self.router_balanced!r}")
        if not self.rope_theta > 0 or not self.norm_eps > 0 or not self.init_std > 0:
            raise ValueError("LlamaConfig: rope_theta, norm_eps and init_std must be > 0")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def kv_width(self) -> int:
        """Output features of the k and v projections."""
        return self.num_kv_heads * self.head_dim

    def num_params(self) -> int:
        attn = 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_width
        mlp = 3 * self.hidden * self.ffn
        if self.experts:
            mlp = self.experts * (mlp + self.hidden)  # each expert's MLP and router column
        per_layer = attn + mlp + 2 * self.hidden
        return 2 * self.vocab * self.hidden + self.layers * per_layer + self.hidden


def ffn_width(hidden: int, multiple: int = 256) -> int:
    """Llama's SwiGLU width: 2/3 of 4 * hidden, rounded up to `multiple`."""
    return -(-(8 * hidden // 3) // multiple) * multiple


CONFIGS = {
    # The demo's model: trains in minutes on two CPU cores.
    "tiny": LlamaConfig(),
    # A 1B-class model: 0.82B parameters with the byte vocabulary used
    # here (a 32k-token vocabulary would add 0.13B).
    "1b": LlamaConfig(hidden=2048, layers=16, heads=16, ffn=ffn_width(2048), seq_len=2048),
    # Four layers of an 8B Llama 3 (its widths, grouped-query attention).
    "8b_slice": LlamaConfig(hidden=4096, layers=4, heads=32, kv_heads=8, ffn=14336,
                            seq_len=4096, rope_theta=500000.0),
    # The mixture-of-experts demo model: tiny's, its MLP four experts, top-2.
    "moe_tiny": LlamaConfig(ffn=176, experts=4, top_k=2),
    # Two layers of a Mixtral 8x7B (its widths: 8 experts of 14336, top-2).
    "mixtral_slice": LlamaConfig(hidden=4096, layers=2, heads=32, kv_heads=8, ffn=14336,
                                 seq_len=4096, rope_theta=1e6, experts=8, top_k=2),
}
