"""fp8kit.torch.Linear vs torch.nn.Linear (bf16) and torchao's Float8Linear,
in one run (ANCHORS.md targets P3 and P4).

Rows:
  large fwd+bwd   8192 tokens x 8192 x 8192, bf16 in and out: the output and
                  all three gradients for a random cotangent (every GEMM stays
                  alive). Target P3: fp8kit >= 1.75x faster than bf16.
  per-call        16 x 1024 input through a 1024 x 1024 layer, fwd and
                  fwd+bwd: launch-bound, so this measures the host-side cost
                  of a call. Target P4: fp8kit <= 1.25x bf16 nn.Linear.
fp8kit runs with delayed scaling and with current scaling (hybrid format:
e4m3 forward, e5m2 gradients). The quantized weight is cached while the
weight is unchanged, as it is between these repeated calls; the rows marked
"no weight cache" re-quantize it on every call (a training step, where the
optimizer changes the weight each time).

Every output is checked against bf16 nn.Linear before anything is timed
(FP8 tolerances; the process exits non-zero on a mismatch). Timing: CUDA
events around back-to-back calls after a warm-up, several rounds, median.
A torch.profiler table of the per-call path (where the microseconds go) is
printed and saved next to the JSON.

    python benchmarks/bench_torch.py --out torch.json
    python benchmarks/bench_torch.py --quick          # smaller, for a smoke run

Needs a CUDA GPU with FP8 (sm_89+) and fp8kit built with CUDA. torchao is
optional (pip install --no-index --no-deps --target DIR torchao-*.whl and
PYTHONPATH=DIR, see ../shared/GPU.md); without it its rows say so.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time

import torch

import fp8kit.torch as ft
from fp8kit.recipe import CurrentScaling, DelayedScaling, Format

RECIPES = {
    "delayed": DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=16),
    "current": CurrentScaling(fp8_format=Format.HYBRID),
}


def cuda_time_ms(fn, iters: int, rounds: int, warmup: int) -> float:
    """Median over rounds of (CUDA-event time of `iters` back-to-back calls) / iters."""
    for _ in range(warmup):
        fn()
    if not torch.cuda.is_available():  # --cpu-smoke: wall time
        times = []
        for _ in range(rounds):
            t = time.perf_counter()
            for _ in range(iters):
                fn()
            times.append((time.perf_counter() - t) / iters * 1e3)
        return statistics.median(times)
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / iters)
    return statistics.median(times)


def host_time_us(fn, iters: int) -> float:
    """Host (CPU) time per call, without waiting for the GPU."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    host = (time.perf_counter() - t) / iters * 1e6
    sync()
    return host


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


class Case:
    """One layer kind under test: how to build it and the context it runs in."""

    def __init__(self, name, make, context=contextlib.nullcontext):
        self.name, self.make, self.context = name, make, context


def cases(k: int, n: int, dev, with_nocache: bool):
    def bf16():
        return torch.nn.Linear(k, n, device=dev, dtype=torch.bfloat16)

    out = [Case("bf16 nn.Linear", bf16)]
    for rname, recipe in RECIPES.items():
        def make(cache=True):
            m = ft.Linear(k, n, device=dev, dtype=torch.bfloat16)
            m.cache_fp8_weight = cache
            return m
        ctx = (lambda r=recipe: ft.autocast(recipe=r))
        out.append(Case(f"fp8kit {rname}", make, ctx))
        if with_nocache:
            out.append(Case(f"fp8kit {rname} (no weight cache)", lambda m=make: m(False), ctx))
    try:
        from torchao.float8 import convert_to_float8_training

        def ao():
            return convert_to_float8_training(torch.nn.Sequential(bf16()))[0]
        out.append(Case("torchao Float8Linear", ao))
    except Exception as e:  # noqa: BLE001 - any import problem means "not available"
        print(f"torchao Float8Linear: not available ({type(e).__name__}: {e}); its rows are "
              "skipped", flush=True)
    return out


def bench_shape(tokens, k, n, dev, args, label, with_nocache):
    torch.manual_seed(0)
    x0 = torch.randn(tokens, k, device=dev, dtype=torch.bfloat16)
    dy = torch.randn(tokens, n, device=dev, dtype=torch.bfloat16)
    all_cases = cases(k, n, dev, with_nocache)
    ref_layer = all_cases[0].make()
    layers = []
    for c in all_cases:
        m = c.make()
        with torch.no_grad():
            m.weight.copy_(ref_layer.weight)
            m.bias.copy_(ref_layer.bias)
        layers.append(m)

    # Each layer runs inside its context (fp8kit.torch.autocast), entered
    # once around many calls as in a training step over many layers.
    def fwd(m, x):
        return m(x)

    def fwd_bwd(m, x):
        y = m(x)
        return (y,) + torch.autograd.grad(y, (x, m.weight, m.bias), dy)

    # Check outputs first.
    x = x0.clone().requires_grad_()
    ref = fwd_bwd(layers[0], x)
    for c, m in zip(all_cases[1:], layers[1:]):
        with c.context():
            for _ in range(3):  # a few steps so delayed scaling runs on its history
                got = fwd_bwd(m, x)
        errs = [rel_err(g, r) for g, r in zip(got, ref)]
        print(f"[{label}] check {c.name}: rel err y {errs[0]:.3g}, dx {errs[1]:.3g}, "
              f"dw {errs[2]:.3g}, db {errs[3]:.3g}", flush=True)
        if errs[0] > 0.1 or errs[1] > 0.2 or errs[2] > 0.2 or errs[3] > 0.05:
            sys.exit(f"bench_torch: {c.name} output differs from bf16 nn.Linear: {errs}")

    rows = []
    for what, fn in (("fwd", fwd), ("fwd+bwd", fwd_bwd)):
        base = None
        for c, m in zip(all_cases, layers):
            x = x0.clone().requires_grad_()
            call = (lambda m=m, x=x, fn=fn: fn(m, x))
            with c.context():
                ms = cuda_time_ms(call, args.iters[label], args.rounds, args.warmup)
                host = host_time_us(call, args.iters[label])
            base = ms if base is None else base
            rows.append({"shape": label, "pass": what, "layer": c.name, "ms": ms,
                         "us_per_call": ms * 1e3, "host_us_per_call": host,
                         "vs_bf16": ms / base, "speedup_vs_bf16": base / ms})
            print(f"[{label}] {what:8s} {c.name:34s} {ms * 1e3:10.1f} us  host "
                  f"{host:8.1f} us  x{base / ms:5.2f} vs bf16", flush=True)
    return rows, all_cases, layers, x0, dy


def profile_per_call(all_cases, layers, x0, dy, out_prefix):
    """torch.profiler of fwd+bwd per-call for bf16 and fp8kit delayed."""
    from torch.profiler import ProfilerActivity, profile
    tables = {}
    for c, m in zip(all_cases, layers):
        if c.name not in ("bf16 nn.Linear", "fp8kit delayed"):
            continue
        x = x0.clone().requires_grad_()

        def step():
            y = m(x)
            torch.autograd.grad(y, (x, m.weight, m.bias), dy)
        cuda = torch.cuda.is_available()
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with c.context():
            for _ in range(20):
                step()
            sync()
            with profile(activities=acts) as prof:
                for _ in range(50):
                    step()
                sync()
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
        tables[c.name] = table
        print(f"\n=== torch.profiler, 50 x fwd+bwd per-call, {c.name} "
              f"(self CPU time = host cost) ===\n{table}", flush=True)
    if out_prefix:
        with open(out_prefix + ".profile.txt", "w") as f:
            for name, t in tables.items():
                f.write(f"=== {name} ===\n{t}\n")
    return tables


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="write the results as JSON here (and the profile next to it)")
    p.add_argument("--quick", action="store_true", help="small large-shape, few iterations")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--cpu-smoke", action="store_true",
                   help="run the script's logic on the CPU with tiny shapes (no GPU numbers)")
    args = p.parse_args()
    if args.cpu_smoke:
        dev, big, args.quick, args.rounds, args.warmup = torch.device("cpu"), 256, True, 2, 1
        args.iters = {"large": 2, "per-call": 20}
        info = {"device": "cpu (smoke run, not a measurement)", "torch": torch.__version__}
    else:
        if not torch.cuda.is_available():
            sys.exit("bench_torch: needs a CUDA GPU (or --cpu-smoke)")
        if not ft.built_with_cuda():
            sys.exit("bench_torch: fp8kit was built without CUDA; rebuild it on the GPU machine")
        dev = torch.device("cuda", torch.cuda.current_device())
        big = 2048 if args.quick else 8192
        args.iters = {"large": 3 if args.quick else 10, "per-call": 100 if args.quick else 500}
        if args.quick:
            args.rounds = 3
        info = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
                "capability": list(torch.cuda.get_device_capability(dev)),
                "non_tn_fp8_gemm": ft.supports_non_tn_fp8_gemm(dev)}
    print(info, flush=True)
    rows, *_ = bench_shape(big, big, big, dev, args, "large", with_nocache=True)
    small_rows, all_cases, layers, x0, dy = bench_shape(16, 1024, 1024, dev, args, "per-call",
                                                        with_nocache=True)
    rows += small_rows
    prefix = args.out[:-5] if args.out and args.out.endswith(".json") else args.out
    tables = profile_per_call(all_cases, layers, x0, dy, prefix)

    print("\n| shape | pass | layer | time (us) | host (us) | speed-up vs bf16 |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['pass']} | {r['layer']} | {r['us_per_call']:.1f} | "
              f"{r['host_us_per_call']:.1f} | {r['speedup_vs_bf16']:.2f}x |")
    targets = {}
    for r in rows:
        if r["layer"] == "fp8kit delayed" and r["shape"] == "large" and r["pass"] == "fwd+bwd":
            targets["P3 large fwd+bwd speed-up (>= 1.75)"] = r["speedup_vs_bf16"]
        if r["layer"] == "fp8kit delayed" and r["shape"] == "per-call":
            targets[f"P4 per-call {r['pass']} time ratio (<= 1.25)"] = r["vs_bf16"]
    print("\nTargets:", json.dumps(targets, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"info": info, "rows": rows, "targets": targets,
                       "profile": tables}, f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
