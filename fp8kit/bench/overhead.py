"""Per-call overhead section: a 16-token input through a 1024x1024
Linear, eager, where launch and host overhead decide the time.
fp8kit.torch.Linear against bf16 torch.nn.Linear, forward and
forward+backward, same weights and inputs, same run; target P4 (a bound
on fp8kit's per-call time relative to bf16's) for the default recipe.

The timed calls run inside one fp8kit.torch.autocast entered before each
timed batch, as in a model whose forward runs many layers in one autocast;
another fwd row enters autocast on every call. fp8kit re-quantizes the
weight every call (cache off, as a training step must); rows with the
weight cache on show what gradient accumulation or inference gets.
torchao's Float8Linear, when installed, is a peer (its time in the fp8kit
column). Each row also records the host time per call (the launch cost; a
GPU busy with earlier work hides it). With --profile (default in the full
mode on a GPU) a torch.profiler table of the fwd+bwd per-call path is
added: see per_call_profile.py.
"""

from __future__ import annotations

import dataclasses
import functools

from fp8kit.bench import per_call_profile, torch_layers
from fp8kit.bench.context import Case, Context
from fp8kit.bench.results import Row

SECTION = "overhead"
SIZE = (16, 1024, 1024)        # tokens, in_features, out_features
QUICK_SIZE = (16, 128, 128)
HOST_ITERS = 200               # calls whose host time is averaged
QUICK_HOST_ITERS = 5


def _variants(mode: str):
    vs = torch_layers.standard_variants(cached=True)
    vs[0] = dataclasses.replace(vs[0], target="P4")   # delayed, cache off
    if mode == "fwd":
        vs.append(dataclasses.replace(vs[0], name="delayed, autocast per call",
                                      autocast_per_call=True, target=None))
    return vs


def run(ctx: Context, mode: str) -> list[Row]:
    tokens, k, n = QUICK_SIZE if ctx.quick else SIZE
    data = torch_layers.inputs(tokens, k, n, ctx.torch_device, copies=1, seed=3)
    variants = _variants(mode)
    out = torch_layers.run_layers(ctx, k, n, data, mode, variants, seed=3,
                                  host_iters=QUICK_HOST_ITERS if ctx.quick else HOST_ITERS)
    group = f"per call, {tokens}x{k}x{n}, {mode}: fp8kit vs bf16 nn.Linear"
    rows = []
    for v in variants:
        rows.append(Row(SECTION, group, v.name, len(rows), "us", "bf16 nn.Linear",
                        target=v.target))
        out.fill(rows[-1], v.name)
    if "torchao" in out.checks or "torchao" in out.errors:
        rows.append(Row(SECTION, group, "torchao Float8Linear (peer)", len(rows), "us",
                        "bf16 nn.Linear", note="torchao's time in the fp8kit column"))
        out.fill(rows[-1], "torchao")
    elif out.torchao_missing:
        rows[0].note = out.torchao_missing
    for r in rows:
        if "fp8kit_host_s" in r.timing:
            host = (f"host {r.timing['fp8kit_host_s'] * 1e6:.1f} us vs "
                    f"{r.timing['anchor_host_s'] * 1e6:.1f} us per call")
            r.note = f"{r.note}; {host}" if r.note else host
    return rows


def cases(ctx: Context) -> list[Case]:
    tokens, k, n = QUICK_SIZE if ctx.quick else SIZE
    out = [Case(SECTION, f"per call {mode}", f"overhead {tokens}x{k}x{n} {mode}",
                functools.partial(run, ctx, mode)) for mode in ("fwd", "fwd+bwd")]
    if ctx.profile:
        out.append(Case(SECTION, "per call profile", f"profile {tokens}x{k}x{n} fwd+bwd",
                        functools.partial(per_call_profile.run, ctx, tokens, k, n)))
    return out
