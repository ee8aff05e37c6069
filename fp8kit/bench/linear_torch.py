"""Linear section, PyTorch (targets P3 and P6-linear): fp8kit.torch.Linear,
bf16 in and out, eager, forward and fwd+bwd, against bf16 torch.nn.Linear
on the same weights and inputs in the same run, against torchao's
Float8Linear when it is installed, and, fwd+bwd at the three large shapes,
against TransformerEngine's te.Linear under the same recipe when TE is
installed (both peers need a GPU). Layers and calls: torch_layers.py.
The targets apply to fwd+bwd with the weight re-quantized every call as
in a training step: P3, delayed and current scaling against TE at 8192^3
and the two Llama shapes (the rows exist only where TE runs; the first
bf16 row notes why otherwise); P6-linear, BlockScaling against bf16 at
8192^3 (where fp8kit's block-scaled GEMM does not run, its row says why
instead of a number), with TE's Float8BlockScaling beside it for
information. Current scaling against bf16, the forward pass alone, the
weight-cached rows
(gradient accumulation, inference), the forward GEMM with fast
accumulation (the recipe's opt-in forward_fast_accumulation; its check
shows the accuracy it costs) and the other sizes are for information. At
the target size, fwd+bwd, a "sustained" row times bf16 and delayed again
in 1.5 s batches, each in its own steady state, with the GPU's clock and
power (timing.measure_sustained).
"""

from __future__ import annotations

import functools

from fp8kit.bench import timing, torch_layers
from fp8kit.bench.context import Case, Context
from fp8kit.bench.gemm_block import fp8kit_block_missing
from fp8kit.bench.results import Row

SECTION = "linear"
TARGET_SIZE = (8192, 8192, 8192)  # tokens, in_features, out_features
TE_SIZES = [TARGET_SIZE, (8192, 4096, 14336), (8192, 14336, 4096)]   # P3's shapes
SIZES = [(4096, 4096, 4096)] + TE_SIZES
QUICK_SIZES = [(64, 64, 64), (128, 128, 64)]
MODES = ("fwd+bwd", "fwd")
PASSES = {"fwd": 1, "fwd+bwd": 3}  # GEMMs per call: forward; + dgrad, wgrad
TE_TARGETS = {"delayed": "P3", "current": "P3", "block": None}   # fp8kit variant vs TE's


def group_bf16(mode: str) -> str:
    return f"PyTorch Linear {mode}, fp8kit vs bf16 nn.Linear"


def group_te(mode: str) -> str:
    return f"PyTorch Linear {mode}, fp8kit vs TransformerEngine te.Linear, same recipe"


def group_torchao(mode: str) -> str:
    return f"PyTorch Linear {mode}, fp8kit delayed vs torchao Float8Linear"


def run_size(ctx: Context, tokens: int, k: int, n: int, seed: int, mode: str) -> list[Row]:
    import torch

    dev = ctx.torch_device
    copies = timing.copies_for_l2(2 * (2 * tokens * k + 2 * tokens * n))
    data = torch_layers.inputs(tokens, k, n, dev, copies, seed)
    flops = PASSES[mode] * 2.0 * tokens * k * n
    case = f"{tokens}x{k}x{n}"
    is_target = mode == "fwd+bwd" and (ctx.quick or (tokens, k, n) == TARGET_SIZE)
    with_te = mode == "fwd+bwd" and (ctx.quick or (tokens, k, n) in TE_SIZES)
    variants = torch_layers.standard_variants(cached=True) + [torch_layers.fast_forward_variant()]
    block = torch_layers.block_variant()
    block_missing = fp8kit_block_missing(dev)
    te_recipes = [r for r in TE_TARGETS if r != "block" or not block_missing] if with_te else []
    out = torch_layers.run_layers(ctx, k, n, data, mode,
                                  variants + ([] if block_missing else [block]), seed,
                                  te_recipes=te_recipes)
    rows = []
    for v in variants + [block]:
        rows.append(Row(SECTION, group_bf16(mode), f"{case} {v.name}", tokens * k * n,
                        "TFLOP/s", "bf16 nn.Linear", fp8kit_work=flops, anchor_work=flops,
                        target="P6-linear" if is_target and v is block else None,
                        note="" if v.cache_weight else "weight re-quantized every call"))
        out.fill(rows[-1], v.name)
    if block_missing:
        rows[-1].note = block_missing
    if out.te_missing:
        rows[0].note += f"; no TE rows: {out.te_missing}"
    for rname in te_recipes if not out.te_missing else ():
        rows.append(Row(SECTION, group_te(mode), f"{case} {rname}", tokens * k * n, "TFLOP/s",
                        f"TransformerEngine {rname}", fp8kit_work=flops, anchor_work=flops,
                        target=TE_TARGETS[rname], note="weight re-quantized every call"))
        out.fill(rows[-1], rname, f"TE {rname}")
        rows[-1].check = f"{out.checks.get(rname, '-')}; {out.checks.get(f'TE {rname}', '-')}"
    if "torchao" in out.checks or "torchao" in out.errors:
        rows.append(Row(SECTION, group_torchao(mode), f"{case} delayed", tokens * k * n,
                        "TFLOP/s", "torchao Float8Linear", fp8kit_work=flops,
                        anchor_work=flops, note="torchao: tensorwise dynamic scaling"))
        out.fill(rows[-1], "delayed", "torchao")
        rows[-1].check = f"{out.checks.get('delayed', '')}; {out.checks.get('torchao', '')}"
    elif out.torchao_missing:
        rows[0].note += f"; {out.torchao_missing}"
    if is_target:
        rows.append(sustained_row(ctx, k, n, data, mode, seed, case, tokens * k * n, flops))
    del data
    if dev == "cuda":
        torch.cuda.empty_cache()
    return rows


def sustained_row(ctx: Context, k: int, n: int, data, mode: str, seed: int, case: str,
                  size: float, flops: float) -> Row:
    delayed = torch_layers.standard_variants(cached=False)[0]
    out = torch_layers.run_layers(ctx, k, n, data, mode, [delayed], seed, sustained=True)
    row = Row(SECTION, group_bf16(mode), f"{case} delayed, sustained", size, "TFLOP/s",
              "bf16 nn.Linear", fp8kit_work=flops, anchor_work=flops)
    out.fill(row, delayed.name)
    if delayed.name in out.timings and "bf16" in out.timings:
        row.note = timing.gpu_note(out.timings[delayed.name], out.timings["bf16"])
    return row


def cases(ctx: Context) -> list[Case]:
    sizes = QUICK_SIZES if ctx.quick else SIZES
    return [Case(SECTION, group_bf16(mode), f"torch Linear {t}x{k}x{n} {mode}",
                 functools.partial(run_size, ctx, t, k, n, i, mode))
            for mode in MODES for i, (t, k, n) in enumerate(sizes)]
