"""Compile section, PyTorch (target P10): fp8kit.torch.Linear fwd+bwd under
torch.compile(fullgraph=True), bf16 in and out, against

    fp8kit eager       the same layer without compile (P10: >= 1.0x)
    torchao            torchao's Float8Linear compiled, tensorwise scaling
                       (P10: >= 1.10x at 8192^3) and rowwise scaling, when
                       torchao is installed and a GPU is present
    bf16 compiled      torch.nn.Linear compiled (information)

all with the same weights and inputs, delayed scaling for fp8kit (the
weight re-quantized every call, as a training step does), each output
checked against eager bf16 before it is timed, all in one
measure_sustained() (interleaved rounds of 1.5 s batches, as the linear
section's large shapes: in 25 ms batches the compiled layer, always timed
right after the eager one, took 2.94 ms per call at 8192^3 where its
profiled kernels span 2.53 ms). Each row notes the GPU's clock and power
during the two batches it compares. Compilation happens in the untimed
warm-up.
"""

from __future__ import annotations

import copy
import functools

from fp8kit.bench import timing, torch_layers
from fp8kit.bench.context import Case, Context
from fp8kit.bench.results import Row

SECTION = "compile"
TARGET_SIZE = (8192, 8192, 8192)
SIZES = [TARGET_SIZE, (8192, 4096, 14336), (8192, 14336, 4096)]
QUICK_SIZES = [(64, 64, 64)]


def _torchao_compiled(base, device: str, recipe_name: str):
    """torchao's Float8Linear (recipe 'tensorwise' or 'rowwise') made from
    `base` and compiled, or (None, reason)."""
    layer, why = torch_layers.torchao_layer(base, device)
    if layer is None:
        return None, why
    import torch
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    config = Float8LinearConfig.from_recipe_name(recipe_name)
    seq = convert_to_float8_training(torch.nn.Sequential(copy.deepcopy(base)), config=config)
    return torch.compile(seq[0], fullgraph=True), None


def _layers(k: int, n: int, device: str, seed: int) -> dict:
    """{name: (layer, fp8kit recipe or None)} with equal weights."""
    import torch
    from fp8kit.recipe import DelayedScaling
    made = torch_layers.make_layers(k, n, device, seed)
    eager = made["fp8kit"]
    eager.cache_fp8_weight = False
    compiled = torch_layers.make_layers(k, n, device, seed)["fp8kit"]
    compiled.cache_fp8_weight = False
    out = {"bf16 compiled": (torch.compile(made["bf16"], fullgraph=True), None),
           "fp8kit eager": (eager, DelayedScaling()),
           "fp8kit compiled": (torch.compile(compiled, fullgraph=True), DelayedScaling())}
    for name in ("tensorwise", "rowwise"):
        layer, why = _torchao_compiled(made["bf16"], device, name)
        out[f"torchao {name} compiled"] = (layer, why)
    return out


def _step(layer, data, recipe):
    """i -> (y, dx, dw, db): fwd+bwd with a random cotangent, in fp8kit's
    autocast when recipe is given (entered per call: compile guards on it)."""
    import torch
    inner = layer._orig_mod if hasattr(layer, "_orig_mod") else layer
    params = [p for p in (inner.weight, inner.bias) if p is not None]

    def step(i):
        x, dy = data[i % len(data)]
        with torch_layers.fp8_context(recipe):
            y = layer(x)
        return (y, *torch.autograd.grad(y, [x, *params], dy))
    return step


def run_size(ctx: Context, tokens: int, k: int, n: int, seed: int) -> list[Row]:
    import torch
    from fp8kit.bench import checks

    dev = ctx.torch_device
    copies = timing.copies_for_l2(2 * (2 * tokens * k + 2 * tokens * n))
    data = torch_layers.inputs(tokens, k, n, dev, copies, seed)
    want = torch_layers.fwd_bwd_fn(torch_layers.make_layers(k, n, dev, seed)["bf16"], data)(0)
    fns, found, errors, missing = {}, {}, {}, {}
    for name, (layer, recipe) in _layers(k, n, dev, seed).items():
        if layer is None:
            missing[name] = recipe   # the reason torchao is missing
            continue
        fn = _step(layer, data, recipe)
        try:
            fn(0)   # compiles; seeds delayed scaling
            found[name] = torch_layers.check_against_bf16(name, fn(0), want)
            fns[name] = fn
        except checks.Mismatch as e:
            errors[name] = f"not timed: {e}"
    t = timing.measure_sustained(fns, timing.torch_clock(dev), ctx.quick)
    flops = 3 * 2.0 * tokens * k * n
    case = f"{tokens}x{k}x{n}"
    is_target = ctx.quick or (tokens, k, n) == TARGET_SIZE
    group = "PyTorch compiled Linear fwd+bwd (torch.compile, fullgraph): fp8kit compiled vs"
    rows = []
    for anchor, target in (("torchao tensorwise compiled", "P10" if is_target else None),
                           ("torchao rowwise compiled", None),
                           ("fp8kit eager", "P10-eager"), ("bf16 compiled", None)):
        if anchor in missing:
            continue
        row = Row(SECTION, f"{group} {anchor}", case, tokens * k * n, "TFLOP/s", anchor,
                  fp8kit_work=flops, anchor_work=flops, target=target,
                  check=f"{found.get('fp8kit compiled', '-')}; {anchor}: {found.get(anchor, '-')}",
                  error=errors.get("fp8kit compiled") or errors.get(anchor))
        if "fp8kit compiled" in t and anchor in t:
            a, b = t["fp8kit compiled"], t[anchor]
            row.fp8kit_s, row.anchor_s = a.median_s, b.median_s
            row.timing = {"fp8kit": a.to_json(), "anchor": b.to_json()}
            row.note = timing.gpu_note(a, b)
        rows.append(row)
    if missing:
        rows[0].note = "; ".join(p for p in (rows[0].note, *sorted(set(missing.values()))) if p)
    del data
    if dev == "cuda":
        torch.cuda.empty_cache()
    return rows


def cases(ctx: Context) -> list[Case]:
    import torch  # noqa: F401  (ImportError here: the suite reports PyTorch as not run)
    sizes = QUICK_SIZES if ctx.quick else SIZES
    return [Case(SECTION, "PyTorch Linear compiled", f"torch Linear compiled {t}x{k}x{n}",
                 functools.partial(run_size, ctx, t, k, n, i))
            for i, (t, k, n) in enumerate(sizes)]
