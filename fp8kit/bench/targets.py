"""The performance targets the suite checks (docs/benchmarks.md says where
they come from). Every target is a ratio measured in one run:

    ratio = anchor seconds / fp8kit seconds      (> 1: fp8kit is faster)

For quantization (P2), the fused normalization (P7-norm) and activations
(P7-act) the "anchor"
is a bandwidth limit measured in the same run (a device-to-device copy),
so the ratio is the fraction of that limit fp8kit reaches.
"""

from __future__ import annotations

import dataclasses
from typing import Optional


@dataclasses.dataclass(frozen=True)
class Target:
    id: str
    text: str
    min_ratio: float                       # every row of the target
    geomean_min: Optional[float] = None    # and the geometric mean of each group


TARGETS = {t.id: t for t in (
    Target("P1", "per-tensor FP8 GEMM >= 1.00x torch._scaled_mm on every shape, "
           "geomean >= 1.03x", 1.00, 1.03),
    Target("P2", "delayed cast+transpose >= 90% of copy bandwidth (4 B/element); current "
           "scaling >= 90% of its two-pass limit", 0.90),
    Target("P3", "PyTorch Linear fwd+bwd, eager, 8192^3 and the two Llama shapes, delayed "
           "and current scaling: >= 1.05x TransformerEngine's te.Linear in the same run, same "
           "recipe", 1.05),
    Target("P4", "PyTorch Linear per call at 16x1024x1024, eager, fwd and fwd+bwd: <= 1.25x "
           "bf16 nn.Linear (ratio >= 0.80)", 1 / 1.25),
    Target("P5-gemm", "JAX jit: fp8kit GEMM on pre-quantized e4m3 at 8192^3 >= 1.45x "
           "lax.dot(a, b) on the same e4m3 data, b [K,N]", 1.45),
    Target("P5-fwd", "JAX jit: dense fwd at 8192^3 (bf16 in, quantization included), delayed "
           "and current scaling: >= 1.05x TransformerEngine-JAX's DenseGeneral in the same run, "
           "same recipe", 1.05),
    Target("P5-fwd+bwd", "JAX jit: dense fwd+bwd at 8192^3 (random cotangent), delayed and "
           "current scaling: >= 1.05x TransformerEngine-JAX's DenseGeneral in the same run, "
           "same recipe", 1.05),
    Target("P6-gemm", "block-scaled FP8 GEMM (1x128 activations x 128x128 weights) >= 1.00x "
           "torch's cuBLASLt block-scaled scaled_mm on the same data and scales, every shape",
           1.00),
    Target("P6-linear", "PyTorch Linear fwd+bwd 8192x8192x8192 under BlockScaling, eager: "
           ">= 1.45x bf16 nn.Linear", 1.45),
    Target("P6-quantize", "block-scaled quantization from bf16 (rowwise + columnwise, "
           "counted as 4 B/element) >= 85% of copy bandwidth", 0.85),
    Target("P7", "fused LayerNormMLP (RMSNorm, SwiGLU, Llama-3-8B block) fwd+bwd >= 1.05x "
           "TransformerEngine's LayerNormMLP in the same run, same recipe", 1.05),
    Target("P7-norm", "the fused normalization forward (bf16 -> FP8 rowwise + columnwise + "
           "amax, counted as 4 B/element) >= 85% of copy bandwidth", 0.85),
    Target("P7-act", "the fused activation kernels (SwiGLU, GELU; forward and backward, bf16 "
           "-> FP8 rowwise + columnwise + amax) >= 90% of the copy bandwidth for their bytes",
           0.90),
    Target("P11-bf16", "PyTorch GroupedLinear fwd+bwd under current, delayed and block "
           "scaling, 8 and 64 experts, balanced and skewed counts: >= 1.4x the bf16 grouped GEMM "
           "(torch._grouped_mm)",
           1.4),
    Target("P11-te", "PyTorch GroupedLinear fwd+bwd, same recipes and shapes: >= 1.05x "
           "TransformerEngine's GroupedLinear in the same run, same recipe", 1.05),
    Target("P10", "torch.compile(fullgraph=True) fp8kit Linear fwd+bwd 8192^3 >= 1.10x "
           "torchao's compiled Float8Linear (tensorwise)", 1.10),
    Target("P10-eager", "torch.compile(fullgraph=True) fp8kit Linear fwd+bwd >= eager "
           "fp8kit.torch.Linear", 1.00),
)}
