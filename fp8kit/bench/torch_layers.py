"""The PyTorch Linear layers the linear and overhead sections compare, built
with the same weights, and the calls they time.

    bf16     torch.nn.Linear in bf16 (the anchor of P3 and P4)
    fp8kit   fp8kit.torch.Linear, bf16 weights, inside fp8kit.torch.autocast
    torchao  torchao's Float8Linear (tensorwise dynamic scaling), when torchao
             is installed and a GPU is present (a peer, for information)

fp8kit layers run with cache_fp8_weight=False unless asked otherwise: a
training step changes the weights, so each timed call re-quantizes the
weight as a step would (the cache helps only when one weight serves
several calls, e.g. gradient accumulation; that variant is a separate row).

fwd+bwd = the output and the gradients of input, weight and bias for a
random cotangent (torch.autograd.grad), so every GEMM does real work.
"""

from __future__ import annotations

import contextlib
import copy

from fp8kit.bench import checks

FWD_TOL = 0.08   # ||fp8 - bf16|| / ||bf16|| of the output (e4m3 x e4m3)
BWD_TOL = 0.15   # of the input and weight gradients (e5m2 gradients under HYBRID)


def make_layers(k: int, n: int, device: str, seed: int):
    """{'bf16': nn.Linear, 'fp8kit': fp8kit.torch.Linear} with equal weights."""
    import torch
    import fp8kit.torch as ft
    torch.manual_seed(seed)
    base = torch.nn.Linear(k, n, device=device, dtype=torch.bfloat16)
    kit = ft.Linear(k, n, device=device, dtype=torch.bfloat16)
    kit.load_state_dict(base.state_dict(), strict=False)
    return {"bf16": base, "fp8kit": kit}


def torchao_layer(base, device: str):
    """torchao's Float8Linear made from `base`, or (None, reason)."""
    if device != "cuda":
        return None, "torchao peer needs a GPU"
    try:
        import torch
        from torchao.float8 import convert_to_float8_training
    except ImportError as e:
        return None, f"torchao not installed ({e})"
    seq = convert_to_float8_training(torch.nn.Sequential(copy.deepcopy(base)))
    return seq[0], None


def inputs(tokens: int, k: int, n: int, device: str, copies: int, seed: int):
    """`copies` pairs (x requiring grad, random cotangent dy), bf16."""
    import torch
    g = torch.Generator(device=device).manual_seed(seed)
    out = []
    for _ in range(copies):
        x = torch.randn(tokens, k, device=device, dtype=torch.bfloat16, generator=g)
        dy = torch.randn(tokens, n, device=device, dtype=torch.bfloat16, generator=g)
        out.append((x.requires_grad_(True), dy))
    return out


def fp8_context(recipe):
    import fp8kit.torch as ft
    return contextlib.nullcontext() if recipe is None else ft.autocast(recipe=recipe)


def forward_fn(layer, data, recipe=None):
    """i -> layer(x_i) (inside fp8kit's autocast when recipe is given)."""
    def fwd(i):
        x, _ = data[i % len(data)]
        with fp8_context(recipe):
            return layer(x)
    return fwd


def fwd_bwd_fn(layer, data, recipe=None):
    """i -> (y, dx, dw, db) for the random cotangent dy_i."""
    import torch
    params = [p for p in (layer.weight, layer.bias) if p is not None]

    def step(i):
        x, dy = data[i % len(data)]
        with fp8_context(recipe):
            y = layer(x)
        return (y, *torch.autograd.grad(y, [x, *params], dy))
    return step


def check_against_bf16(what: str, got, want) -> str:
    """got / want: outputs of forward_fn or fwd_bwd_fn (one call each)."""
    if not isinstance(got, tuple):
        return checks.within(f"{what} output", checks.norm_rel_err(got, want), FWD_TOL,
                             "rel err")
    errs = [checks.norm_rel_err(got[0], want[0])]
    checks.within(f"{what} output", errs[0], FWD_TOL, "rel err")
    for name, g, w in zip(("dx", "dw"), got[1:3], want[1:3]):
        errs.append(checks.norm_rel_err(g, w))
        checks.within(f"{what} {name}", errs[-1], BWD_TOL, "rel err")
    return (f"rel err y {errs[0]:.2g}<={FWD_TOL:g}, dx {errs[1]:.2g} dw {errs[2]:.2g}"
            f"<={BWD_TOL:g}")
