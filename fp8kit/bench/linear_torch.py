"""Linear section, PyTorch (ANCHORS.md target P3): fp8kit.torch.Linear
fwd+bwd, bf16 in and out, eager, against bf16 torch.nn.Linear on the same
weights and inputs in the same run (and torchao's Float8Linear when it is
installed). Layers and calls: torch_layers.py. The target applies to the
default recipe (delayed scaling) at ANCHORS.md's size, 8192 tokens x 8192
x 8192; current scaling and the other sizes are for information.
"""

from __future__ import annotations

import functools

from fp8kit.bench import checks, timing, torch_layers
from fp8kit.bench.context import Case, Context
from fp8kit.bench.results import Row

SECTION = "linear"
TARGET_SIZE = (8192, 8192, 8192)  # tokens, in_features, out_features
SIZES = [(4096, 4096, 4096), TARGET_SIZE]
QUICK_SIZES = [(64, 64, 64), (128, 128, 64)]
G_BF16 = "PyTorch Linear fwd+bwd, fp8kit vs bf16 nn.Linear"
G_AO = "PyTorch Linear fwd+bwd, fp8kit delayed vs torchao Float8Linear"


def run_size(ctx: Context, tokens: int, k: int, n: int, seed: int) -> list[Row]:
    import torch
    from fp8kit.recipe import CurrentScaling, DelayedScaling

    dev = ctx.torch_device
    layers = torch_layers.make_layers(k, n, dev, seed)
    layers["fp8kit"].cache_fp8_weight = False
    copies = timing.copies_for_l2(2 * (2 * tokens * k + 2 * tokens * n))
    data = torch_layers.inputs(tokens, k, n, dev, copies, seed)
    flops = 3 * 2.0 * tokens * k * n  # forward, dgrad, wgrad
    case = f"{tokens}x{k}x{n}"
    is_target = ctx.quick or (tokens, k, n) == TARGET_SIZE
    fns = {"bf16": torch_layers.fwd_bwd_fn(layers["bf16"], data)}
    want = fns["bf16"](0)
    rows = []
    for name, recipe in (("delayed", DelayedScaling()), ("current", CurrentScaling())):
        row = Row(SECTION, G_BF16, f"{case} {name}", tokens * k * n, "TFLOP/s",
                  "bf16 nn.Linear", fp8kit_work=flops, anchor_work=flops,
                  target="P3" if name == "delayed" and is_target else None,
                  note="weight re-quantized every call (cache off)")
        rows.append(row)
        fn = torch_layers.fwd_bwd_fn(layers["fp8kit"], data, recipe)
        try:
            fn(0)  # the first delayed-scaling call seeds the scales
            row.check = torch_layers.check_against_bf16("fp8kit", fn(0), want)
            fns[name] = fn
        except checks.Mismatch as e:
            row.error = f"not timed: {e}"
    ao, why = torchao_layer_row(ctx, layers["bf16"], data, case, tokens * k * n, flops, want)
    if ao is not None:
        rows.append(ao[0])
        if ao[1] is not None:
            fns["torchao"] = ao[1]
    t = timing.measure(fns, timing.torch_clock(dev), ctx.settings)
    for row, name in zip(rows, ("delayed", "current")):
        if name in t:
            row.fp8kit_s, row.anchor_s = t[name].median_s, t["bf16"].median_s
            row.timing = {"fp8kit": t[name].to_json(), "anchor": t["bf16"].to_json()}
    if ao is not None and "torchao" in t and "delayed" in t:
        r = ao[0]
        r.fp8kit_s, r.anchor_s = t["delayed"].median_s, t["torchao"].median_s
        r.timing = {"fp8kit": t["delayed"].to_json(), "anchor": t["torchao"].to_json()}
    if why:
        rows[0].note += f"; {why}"
    del data, layers
    if dev == "cuda":
        torch.cuda.empty_cache()
    return rows


def torchao_layer_row(ctx, base, data, case, size, flops, want):
    """((row, fn or None) or None, reason torchao is absent or None)."""
    layer, why = torch_layers.torchao_layer(base, ctx.torch_device)
    if layer is None:
        return None, why
    row = Row(SECTION, G_AO, f"{case} delayed", size, "TFLOP/s", "torchao Float8Linear",
              fp8kit_work=flops, anchor_work=flops, note="torchao: tensorwise dynamic scaling")
    fn = torch_layers.fwd_bwd_fn(layer, data)
    try:
        row.check = "torchao vs bf16: " + torch_layers.check_against_bf16("torchao", fn(0), want)
    except checks.Mismatch as e:
        row.error = f"not timed: {e}"
        fn = None
    return (row, fn), None


def cases(ctx: Context) -> list[Case]:
    sizes = QUICK_SIZES if ctx.quick else SIZES
    return [Case(SECTION, G_BF16, f"torch Linear {t}x{k}x{n}",
                 functools.partial(run_size, ctx, t, k, n, i)) for i, (t, k, n) in enumerate(sizes)]
