"""Fused section, the normalization kernels alone: fp8kit's RMSNorm and
LayerNorm forward as the fused layers run it in training (ext.norm_forward:
bf16 in, the FP8 GEMM input rowwise and columnwise out, the amax recorded
into the delayed-scaling state), against the bandwidth limit measured in
the same run.

Bytes are counted as quantization's (P2) are: read 2 B + write 1 B
(rowwise) + 1 B (columnwise) = 4 B/element (gamma, beta and the per-row
statistics are under 0.1% at these widths), and the limit is a
device-to-device copy of the same bf16 tensor (4 B/element), timed in the
same alternating rounds. Target P7-norm: 85% of that copy. The note also
gives the fraction of the H200's datasheet HBM bandwidth.

Shapes: 8192 tokens at hidden 4096 and 8192 (the fused-layer rows' and the
kernel profile's). Before timing, the columnwise copy must be the rowwise
one transposed, bit for bit, and the rowwise copy dequantized must match
the float64 normalization within E4M3's rounding.
"""

from __future__ import annotations

from fp8kit.bench import checks, timing
from fp8kit.bench.context import Case, Context, copy_anchored, shape_cases
from fp8kit.bench.quantize import bf16_inputs
from fp8kit.bench.results import Row

SECTION = "fused"
GROUP = "normalization forward + FP8 cast (bf16 -> e4m3 row+col, amax), vs copy"
SHAPES = [(8192, 4096), (8192, 8192)]
QUICK_SHAPES = [(48, 64)]
NORMS = ("RMSNorm", "LayerNorm")
EPS = 1e-5
HBM_DATASHEET_TBS = 4.8    # H200 HBM3e (NVIDIA's datasheet); the copy measured here is lower
FP8_TOL = 2.0 ** -4        # ||dequantized - float64|| / ||float64||: E4M3 rounds by <= 2^-4


def _seeded_state(norm: str, hidden: int, x, recipe):
    """A LayerNormLinear's scaling state after one training forward (the
    input slot seeded from x's amax), its gamma and beta, and the slot."""
    import torch
    import fp8kit.torch as ft
    from fp8kit.torch._ext import ext
    layer = ft.LayerNormLinear(hidden, 16, bias=False, normalization=norm, eps=EPS,
                               device=x.device, dtype=torch.bfloat16)
    with torch.no_grad():   # a non-trivial gain (and shift), as a trained layer has
        layer.layer_norm_weight.uniform_(0.5, 1.5)
        if layer.layer_norm_bias is not None:
            layer.layer_norm_bias.uniform_(-0.1, 0.1)
    with ft.autocast(recipe=recipe):
        layer(x.detach().requires_grad_()).sum().backward()
    gamma = layer.layer_norm_weight.detach()
    beta = layer.layer_norm_bias.detach() if layer.layer_norm_bias is not None else None
    return layer.fp8_state_for(recipe)[0], gamma, beta, ext.SLOT_INPUT


def _float64_norm(x, gamma, beta, norm: str):
    import torch
    x = x.double()
    if norm == "LayerNorm":
        x = x - x.mean(-1, keepdim=True)
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * gamma.double()
    return y + beta.double() if beta is not None else y


def run_shape(ctx: Context, tokens: int, hidden: int, seed: int) -> list[Row]:
    import torch
    from fp8kit.recipe import DelayedScaling
    from fp8kit.torch._ext import ext

    dev = ctx.torch_device
    n = tokens * hidden
    xs, copy = bf16_inputs(tokens, hidden, dev, seed)
    copies = len(xs)
    fns = {"copy": copy}
    rows = {}
    for norm in NORMS:
        row = Row(SECTION, GROUP, f"{norm} {tokens}x{hidden}", n, "TB/s",
                  "copy-speed limit (4 B/el)", fp8kit_work=4 * n, anchor_work=4 * n,
                  target="P7-norm")
        rows[norm] = row
        try:
            st, gamma, beta, slot = _seeded_state(norm, hidden, xs[0], DelayedScaling())

            def fn(i, norm=norm, st=st, gamma=gamma, beta=beta, slot=slot):
                # record=True, rowwise and columnwise, no bf16 output: the
                # training forward of a LayerNormLinear / LayerNormMLP.
                return ext.norm_forward(xs[i % copies], gamma, beta, norm, EPS, st, slot,
                                        True, True, True, False)
            row.check = checks.fp8_copies(norm, fn(0), _float64_norm(xs[0], gamma, beta, norm),
                                           FP8_TOL)
            fns[norm] = fn
        except checks.Mismatch as e:
            row.error = f"not timed: {e}"
    t = timing.measure(fns, timing.torch_clock(dev), ctx.settings)
    copy_anchored(rows, t, n, copies, 4)
    for norm, row in rows.items():
        if norm in t and dev == "cuda":
            hbm = 4 * n / t[norm].median_s / 1e12 / HBM_DATASHEET_TBS
            row.check += f"; {100 * hbm:.0f}% of the {HBM_DATASHEET_TBS:g} TB/s datasheet HBM"
    del xs, copy, fns
    if dev == "cuda":
        torch.cuda.empty_cache()
    return list(rows.values())


def cases(ctx: Context) -> list[Case]:
    return shape_cases(ctx, SECTION, GROUP, "norm forward + cast", run_shape, SHAPES,
                       QUICK_SHAPES)
