"""A torch.profiler table of the per-call path (where a launch-bound
call's microseconds go), for the overhead section.

The P4 case, fwd+bwd: a 16-token input through a 1024x1024 layer (the
quick mode's smaller layer on the CPU), bf16 torch.nn.Linear and
fp8kit.torch.Linear with delayed scaling and the weight cache off (the P4
row), same weights and inputs. Each runs WARMUP calls, then ITERS profiled
calls, inside one fp8kit.torch.autocast as the timed rows do. The table is
sorted by self CPU time, which is the host cost of each op (CUDA columns
too on a GPU); its totals are for ITERS calls, profiler overhead included.
The tables go into ctx.profiles (printed and written into the JSON).
"""

from __future__ import annotations

import contextlib

from fp8kit.bench import torch_layers
from fp8kit.bench.context import Context

WARMUP = 20
ITERS = 50        # cheap: the profile is a breakdown, not a measurement
ROW_LIMIT = 25


def profile_table(fn, device: str, context) -> str:
    """key_averages() table of ITERS calls fn(0), fn(1), ... inside `context`."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with context:
        for i in range(WARMUP):
            fn(i)
        sync()
        with profile(activities=acts) as prof:
            for i in range(ITERS):
                fn(i)
            sync()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=ROW_LIMIT)


def run(ctx: Context, tokens: int, k: int, n: int) -> list:
    import fp8kit.torch as ft
    from fp8kit.recipe import DelayedScaling

    dev = ctx.torch_device
    layers = torch_layers.make_layers(k, n, dev, seed=3)
    layers["fp8kit"].cache_fp8_weight = False
    data = torch_layers.inputs(tokens, k, n, dev, copies=1, seed=3)
    for name, layer, context in (
            ("bf16 nn.Linear", layers["bf16"], contextlib.nullcontext()),
            ("fp8kit delayed (weight cache off)", layers["fp8kit"],
             ft.autocast(recipe=DelayedScaling()))):
        title = (f"torch.profiler, {ITERS} x fwd+bwd per call, {tokens}x{k}x{n} on {dev}, "
                 f"{name} (self CPU time = host cost)")
        ctx.profiles[title] = profile_table(torch_layers.fwd_bwd_fn(layer, data), dev, context)
    return []
