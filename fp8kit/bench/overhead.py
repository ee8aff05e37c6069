"""Per-call overhead section (ANCHORS.md target P4): a 16-token input
through a 1024x1024 Linear, eager, where launch and host overhead decide
the time. fp8kit.torch.Linear against bf16 torch.nn.Linear, forward and
forward+backward, same weights and inputs, same run; target: fp8kit's
per-call time <= 1.25x bf16's (ratio >= 0.80) for the default recipe.

The timed calls run inside one fp8kit.torch.autocast entered before each
timed batch, as in a model whose forward runs many layers in one autocast;
another fwd row enters autocast on every call. fp8kit re-quantizes the
weight every call (cache off, as a training step must); a row with the
weight cache on shows what gradient accumulation or inference gets.
"""

from __future__ import annotations

import functools

from fp8kit.bench import checks, timing, torch_layers
from fp8kit.bench.context import Case, Context
from fp8kit.bench.results import Row

SECTION = "overhead"
SIZE = (16, 1024, 1024)        # tokens, in_features, out_features
QUICK_SIZE = (16, 128, 128)


def _variants():
    from fp8kit.recipe import CurrentScaling, DelayedScaling
    # name, recipe, weight cache on, autocast entered on every call, target
    return [("delayed", DelayedScaling(), False, False, "P4"),
            ("current", CurrentScaling(), False, False, None),
            ("delayed, weight cached", DelayedScaling(), True, False, None),
            ("delayed, autocast per call", DelayedScaling(), False, True, None)]


def run(ctx: Context, mode: str) -> list[Row]:
    import fp8kit.torch as ft

    dev = ctx.torch_device
    tokens, k, n = QUICK_SIZE if ctx.quick else SIZE
    layers = torch_layers.make_layers(k, n, dev, seed=3)
    data = torch_layers.inputs(tokens, k, n, dev, copies=1, seed=3)
    make = torch_layers.forward_fn if mode == "fwd" else torch_layers.fwd_bwd_fn
    group = f"per call, {tokens}x{k}x{n}, {mode}: fp8kit vs bf16 nn.Linear"
    fns = {"bf16": make(layers["bf16"], data)}
    around = {}
    want = fns["bf16"](0)
    rows = {}
    for name, recipe, cache, per_call, target in _variants():
        if per_call and mode != "fwd":
            continue
        layer = torch_layers.make_layers(k, n, dev, seed=3)["fp8kit"]
        layer.cache_fp8_weight = cache
        row = Row(SECTION, group, name, len(rows), "us", "bf16 nn.Linear", target=target)
        rows[name] = row
        if per_call:
            fn = make(layer, data, recipe)
        else:
            fn = make(layer, data)
            around[name] = functools.partial(ft.autocast, recipe=recipe)
        try:
            with ft.autocast(enabled=not per_call, recipe=recipe):
                fn(0)  # the first delayed-scaling call seeds the scales
                row.check = torch_layers.check_against_bf16("fp8kit", fn(0), want)
            fns[name] = fn
        except checks.Mismatch as e:
            row.error = f"not timed: {e}"
    ao, why = torch_layers.torchao_layer(layers["bf16"], dev)
    if ao is not None:
        row = Row(SECTION, group, "torchao Float8Linear (peer)", len(rows), "us",
                  "bf16 nn.Linear", note="torchao's time in the fp8kit column")
        rows["torchao"] = row
        fn = make(ao, data)
        try:
            row.check = torch_layers.check_against_bf16("torchao", fn(0), want)
            fns["torchao"] = fn
        except checks.Mismatch as e:
            row.error = f"not timed: {e}"
    elif why:
        next(iter(rows.values())).note = why
    t = timing.measure(fns, timing.torch_clock(dev), ctx.settings, around=around)
    for name, row in rows.items():
        if name in t:
            row.fp8kit_s, row.anchor_s = t[name].median_s, t["bf16"].median_s
            row.timing = {"fp8kit": t[name].to_json(), "anchor": t["bf16"].to_json()}
    return list(rows.values())


def cases(ctx: Context) -> list[Case]:
    tokens, k, n = QUICK_SIZE if ctx.quick else SIZE
    return [Case(SECTION, f"per call {mode}", f"overhead {tokens}x{k}x{n} {mode}",
                 functools.partial(run, ctx, mode)) for mode in ("fwd", "fwd+bwd")]
