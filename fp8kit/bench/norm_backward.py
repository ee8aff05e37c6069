"""Fused section, the normalization backward alone: fp8kit's RMSNorm and
LayerNorm backward as the fused layers run it in training
(ext.norm_backward: bf16 dy and x in, bf16 dx and the parameter gradients
out), against the bandwidth limit measured in the same run.

Bytes moved per element: read dy and x, write dx, 6 B (gamma, the per-row
statistics and the parameter gradients are under 0.1% at these widths).
The limit is a device-to-device copy of the same bf16 tensor (4 B/element),
timed in the same alternating rounds and scaled to 6 B. Information: no
target (P7-norm is the forward's).

Shapes: a decoder step's 4096 tokens and the fused rows' 8192, at hidden
4096, and 8192 x 8192. Before timing, dx, dgamma (and LayerNorm's dbeta)
must match float64 autograd of the same normalization within bf16's
rounding.
"""

from __future__ import annotations

from fp8kit.bench import checks, timing
from fp8kit.bench.context import Case, Context, copy_anchored, shape_cases
from fp8kit.bench.quantize import bf16_inputs
from fp8kit.bench.results import Row

SECTION = "fused"
GROUP = "normalization backward (bf16 dy, x -> dx, dgamma), vs bytes-moved limit"
SHAPES = [(4096, 4096), (8192, 4096), (8192, 8192)]
QUICK_SHAPES = [(48, 64)]
NORMS = ("RMSNorm", "LayerNorm")
EPS = 1e-5
BYTES_PER_ELEMENT = 6
TOL = 2.0 ** -7  # ||got - float64|| / ||float64||: bf16 outputs round by <= 2^-9


def _statistics(x, norm: str):
    """(mean or None, rsigma) in float32, as the forward writes them."""
    import torch
    x = x.float()
    mean = x.mean(-1) if norm == "LayerNorm" else None
    centred = x - mean[:, None] if mean is not None else x
    return mean, torch.rsqrt(centred.pow(2).mean(-1) + EPS)


def _float64_grads(dy, x, gamma, norm: str):
    """(dx, dgamma, dbeta or None) of the normalization by float64 autograd."""
    import torch
    x = x.double().requires_grad_()
    g = gamma.double().requires_grad_()
    b = torch.zeros_like(g, requires_grad=True) if norm == "LayerNorm" else None
    xc = x - x.mean(-1, keepdim=True) if norm == "LayerNorm" else x
    y = xc * torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + EPS) * g
    (y + b if b is not None else y).backward(dy.double())
    return x.grad, g.grad, b.grad if b is not None else None


def run_shape(ctx: Context, tokens: int, hidden: int, seed: int) -> list[Row]:
    import torch
    from fp8kit.torch._ext import ext

    dev = ctx.torch_device
    n = tokens * hidden
    xs, copy = bf16_inputs(tokens, hidden, dev, seed)
    copies = len(xs)
    g = torch.Generator(device=dev).manual_seed(seed + 1)
    dys = [torch.randn(tokens, hidden, device=dev, dtype=torch.bfloat16, generator=g)
           for _ in range(copies)]
    gamma = torch.empty(hidden, device=dev).uniform_(0.5, 1.5, generator=g).bfloat16()
    fns = {"copy": copy}
    rows = {}
    for norm in NORMS:
        row = Row(SECTION, GROUP, f"{norm} {tokens}x{hidden}", n, "TB/s",
                  "bytes-moved limit (copy)", fp8kit_work=BYTES_PER_ELEMENT * n,
                  anchor_work=BYTES_PER_ELEMENT * n)
        rows[norm] = row
        stats = [_statistics(x, norm) for x in xs]

        def fn(i, norm=norm, stats=stats):
            mean, rsigma = stats[i % copies]
            return ext.norm_backward(dys[i % copies], xs[i % copies], mean, rsigma, gamma,
                                     norm, EPS)
        try:
            got, want = fn(0), _float64_grads(dys[0], xs[0], gamma, norm)
            names = ("dx", "dgamma", "dbeta")
            row.check = "; ".join(
                f"{name}: " + checks.within(f"{norm} {name}", checks.norm_rel_err(a, b), TOL,
                                            "rel err")
                for name, a, b in zip(names, got, want) if b is not None)
            fns[norm] = fn
        except checks.Mismatch as e:
            row.error = f"not timed: {e}"
    t = timing.measure(fns, timing.torch_clock(dev), ctx.settings)
    copy_anchored(rows, t, n, copies, BYTES_PER_ELEMENT)
    del xs, dys, copy, fns
    if dev == "cuda":
        torch.cuda.empty_cache()
    return list(rows.values())


def cases(ctx: Context) -> list[Case]:
    return shape_cases(ctx, SECTION, GROUP, "norm backward", run_shape, SHAPES, QUICK_SHAPES)
