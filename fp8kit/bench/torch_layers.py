"""The PyTorch Linear layers the linear and overhead sections compare, built
with the same weights, and the calls they time.

    bf16     torch.nn.Linear in bf16 (the anchor of P3, P4 and P6-linear)
    fp8kit   fp8kit.torch.Linear, bf16 weights, inside fp8kit.torch.autocast
    torchao  torchao's Float8Linear (tensorwise dynamic scaling), when torchao
             is installed and a GPU is present (a peer, for information)
    TE       TransformerEngine's te.Linear under its delayed, current or block
             recipe (te_peer.py), when asked for and installed (a GPU only)

fp8kit layers run with cache_fp8_weight=False unless asked otherwise: a
training step changes the weights, so each timed call re-quantizes the
weight as a step would (the cache helps only when one weight serves
several calls, e.g. gradient accumulation; that variant is a separate row).

fwd+bwd = the output and the gradients of input, weight and bias for a
random cotangent (torch.autograd.grad), so every GEMM does real work.

run_layers() is what the linear and overhead sections share: every layer
on the same inputs, checked against bf16 first, timed in one measure().
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
from typing import Optional

from fp8kit.bench import checks, te_peer, timing

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


@dataclasses.dataclass(frozen=True)
class Variant:
    """One fp8kit.torch.Linear configuration under test."""

    name: str
    recipe: object
    cache_weight: bool = False        # reuse the quantized weight (not a training step)
    autocast_per_call: bool = False   # enter autocast on every call, not once per batch
    target: Optional[str] = None      # the target this variant's row checks


def standard_variants(cached: bool = True) -> list:
    """Delayed and current scaling, weight re-quantized every call (as a
    training step must), and with the weight cache on when `cached`."""
    from fp8kit.recipe import CurrentScaling, DelayedScaling
    out = [Variant("delayed", DelayedScaling()), Variant("current", CurrentScaling())]
    if cached:
        out += [Variant("delayed, weight cached", DelayedScaling(), cache_weight=True),
                Variant("current, weight cached", CurrentScaling(), cache_weight=True)]
    return out


def fast_forward_variant() -> Variant:
    """Delayed scaling with the forward GEMM's fast accumulation (opt-in)."""
    from fp8kit.recipe import DelayedScaling
    return Variant("delayed, fast fwd acc", DelayedScaling(forward_fast_accumulation=True))


def block_variant() -> Variant:
    """Block scaling (1x128 tiles for x and dy, 128x128 blocks for the weight)."""
    from fp8kit.recipe import BlockScaling
    return Variant("block", BlockScaling())


@dataclasses.dataclass
class Outcome:
    """What run_layers measured, keyed by "bf16", a variant's name, "torchao"
    or "TE <recipe>"."""

    timings: dict                     # name -> timing.Timing (only the checked ones)
    checks: dict                      # name -> description of the passed check
    errors: dict                      # name -> why it was not timed
    host_s: dict                      # name -> host seconds per call (when asked)
    torchao_missing: Optional[str]    # why there is no torchao layer, or None
    te_missing: Optional[str] = None  # why there are no TE layers (when asked), or None

    def fill(self, row, kit: str, anchor: str = "bf16") -> None:
        """Sets row's check or error and its times: `kit` in the fp8kit
        column, `anchor` in the anchor column."""
        row.check = self.checks.get(kit, "")
        row.error = self.errors.get(kit) or self.errors.get(anchor)
        if kit in self.timings and anchor in self.timings:
            tk, ta = self.timings[kit], self.timings[anchor]
            row.fp8kit_s, row.anchor_s = tk.median_s, ta.median_s
            row.timing = {"fp8kit": tk.to_json(), "anchor": ta.to_json()}
            if kit in self.host_s and anchor in self.host_s:
                row.timing.update(fp8kit_host_s=self.host_s[kit],
                                  anchor_host_s=self.host_s[anchor])


def _te_for(dev: str):
    """(transformer_engine.pytorch, None), or (None, why not) (it needs a GPU)."""
    if dev != "cuda":
        return None, "TransformerEngine peer needs a GPU"
    return te_peer.torch_module()


def _add_te(te_recipes, base, data, make, want, fns, found, errors, dev) -> Optional[str]:
    """TE's te.Linear per recipe name into fns ("TE <recipe>"), each its
    own layer (its own FP8 state) in its own autocast per call; returns why
    TE is missing, or None."""
    te, missing = _te_for(dev)
    for rname in te_recipes if te is not None else ():
        name = f"TE {rname}"
        try:
            fn = te_peer.per_call_autocast(make(te_peer.torch_linear(te, base), data),
                                           te_peer.torch_autocast(te, rname))
            for _ in range(2):   # delayed: TE updates its scales as each autocast exits
                fn(0)
            found[name] = "TE vs bf16: " + check_against_bf16("TE", fn(0), want)
            fns[name] = fn
        except Exception as e:  # noqa: BLE001  (a failing peer must not cost fp8kit's rows)
            errors[name] = f"TE not timed: {type(e).__name__}: {str(e)[:300]}"
    return missing


def run_layers(ctx, k: int, n: int, data, mode: str, variants, seed: int,
               host_iters: int = 0, sustained: bool = False, te_recipes=()) -> Outcome:
    """Times bf16 nn.Linear, one fp8kit.torch.Linear per variant and (on a
    GPU, when installed) torchao's Float8Linear, all with the same weights,
    on `data` (see inputs()); mode "fwd" or "fwd+bwd". Each output is
    checked against bf16's first (a mismatch is reported, not timed). fp8kit
    layers run inside fp8kit.torch.autocast entered once around each timed
    batch (as in a model whose forward runs many layers in one autocast),
    or on every call for variants that ask for it. host_iters > 0 also
    measures host time per call (timing.host_seconds). sustained: time with
    timing.measure_sustained, without torchao. te_recipes: TE's te.Linear
    under each of these recipes ("delayed", "current", "block") too."""
    import fp8kit.torch as ft

    dev = ctx.torch_device
    make = forward_fn if mode == "fwd" else fwd_bwd_fn
    base = make_layers(k, n, dev, seed)["bf16"]
    fns = {"bf16": make(base, data)}
    want = fns["bf16"](0)
    around, found, errors = {}, {}, {}
    for v in variants:
        layer = make_layers(k, n, dev, seed)["fp8kit"]   # one per variant: its own FP8 state
        layer.cache_fp8_weight = v.cache_weight
        if v.autocast_per_call:
            fn = make(layer, data, v.recipe)
        else:
            fn = make(layer, data)
            around[v.name] = functools.partial(ft.autocast, recipe=v.recipe)
        try:
            with ft.autocast(enabled=not v.autocast_per_call, recipe=v.recipe):
                fn(0)  # the first delayed-scaling call seeds the scales
                found[v.name] = check_against_bf16("fp8kit", fn(0), want)
            fns[v.name] = fn
        except checks.Mismatch as e:
            errors[v.name] = f"not timed: {e}"
    ao, why = (None, None) if sustained else torchao_layer(base, dev)
    if ao is not None:
        fn = make(ao, data)
        try:
            found["torchao"] = "torchao vs bf16: " + check_against_bf16("torchao", fn(0), want)
            fns["torchao"] = fn
        except checks.Mismatch as e:
            errors["torchao"] = f"torchao not timed: {e}"
    te_missing = (_add_te(te_recipes, base, data, make, want, fns, found, errors, dev)
                  if te_recipes else None)
    clock = timing.torch_clock(dev)
    if sustained:
        t = timing.measure_sustained(fns, clock, ctx.quick, around=around)
    else:
        t = timing.measure(fns, clock, ctx.settings, around=around)
    host = timing.host_seconds(fns, clock, host_iters, around) if host_iters else {}
    return Outcome(t, found, errors, host, why, te_missing)
