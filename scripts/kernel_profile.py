"""Where does the GPU time of one large training step of a layer go?

torch.profiler (CUPTI, which sees every kernel of the process, XLA's too)
over ITERS fwd+bwd calls at tokens x features x features, printed as tables
of CUDA kernels sorted by total GPU time, each followed by the GPU's busy
and idle time per call:
  torch  fp8kit.torch.Linear (delayed scaling, weight re-quantized every
         call) and bf16 torch.nn.Linear, with bias;
  jax    the jit'd fwd+bwd of fp8kit.jax.dense (delayed) and of bf16 x @ w,
         as the bench times them (no bias), plus the ops of the optimized
         HLO that are not fusions of elementwise work.
The kernel times, not the wall time, are the point: which GEMM ran how
long, and what the casts, reductions and copies cost. scripts/gpu_check.sh
runs it as its kprofile stage.

    python scripts/kernel_profile.py [--tokens 8192 --features 8192 --iters 10]
                                     [--frameworks torch,jax]
"""

import argparse
import re

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import fp8kit.torch as ft
from fp8kit.bench import torch_layers
from fp8kit.bench.kernel_times import busy_and_span
from fp8kit.recipe import DelayedScaling


def kernel_table(fn, iters: int, sync) -> str:
    """The kernel table of `iters` calls, then the GPU's busy time against
    the profiled window: idle time is what the calls cost beyond their
    kernels (launch gaps, host-side waits)."""
    for i in range(3):
        fn(i)
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(iters):
            fn(i)
        sync()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=20,
                                      max_name_column_width=90)
    busy, span = busy_and_span((e.time_range.start, e.time_range.end) for e in prof.events()
                               if e.device_type == DeviceType.CUDA)
    return (f"{table}\nGPU busy {busy / iters:.0f} us per call of a {span / iters:.0f} us "
            f"window per call (first kernel start to last kernel end): idle "
            f"{(span - busy) / iters:.0f} us per call")


def torch_tables(t: int, f: int, iters: int) -> None:
    layers = torch_layers.make_layers(f, f, "cuda", seed=0)
    layers["fp8kit"].cache_fp8_weight = False
    data = torch_layers.inputs(t, f, f, "cuda", copies=1, seed=0)
    for name, layer in layers.items():
        fn = torch_layers.fwd_bwd_fn(layer, data)
        with ft.autocast(enabled=name == "fp8kit", recipe=DelayedScaling()):
            print(f"== torch {name}: {iters} x fwd+bwd, {t}x{f}x{f}, CUDA time per kernel")
            print(kernel_table(fn, iters, torch.cuda.synchronize))


def jax_tables(t: int, f: int, iters: int) -> None:
    import jax  # here, not at the top: --frameworks torch runs without JAX
    import jax.numpy as jnp
    import fp8kit.jax as fj
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    x = jax.random.normal(k1, (t, f), jnp.bfloat16)
    w = (jax.random.normal(k2, (f, f), jnp.float32) / f ** 0.5).astype(jnp.bfloat16)
    dy = jax.random.normal(k3, (t, f), jnp.bfloat16)
    recipe = DelayedScaling()
    st = fj.DelayedScalingState.create(recipe)

    def fwd_bwd(fn):
        def run(x, w, st, dy):
            y, vjp = jax.vjp(fn, x, w, st)
            return y, vjp(dy)
        return jax.jit(run)

    fns = {"fp8kit delayed": fwd_bwd(lambda x, w, st: fj.dense(x, w, state=st, recipe=recipe)),
           "bf16": fwd_bwd(lambda x, w, st: x @ w)}
    for name, jf in fns.items():
        hlo = jf.lower(x, w, st, dy).compile().as_text()
        entry = hlo[hlo.index("\nENTRY"):]
        print(f"== jax {name}: ops of the optimized HLO's entry computation")
        for line in entry.splitlines()[1:]:
            m = re.search(r"= (\(.*?\)|\S+) ([\w-]+)\(", line)
            if m and m.group(2) not in ("parameter", "get-tuple-element", "tuple",
                                        "constant", "bitcast"):
                what = re.search(r'custom_call_target="([^"]+)"|kind=(k\w+)', line)
                print("  ", m.group(2), what.group(what.lastindex) if what else "", m.group(1))
        print(f"== jax {name}: {iters} x jit'd fwd+bwd, {t}x{f}x{f}, CUDA time per kernel")
        last = []  # the newest output: sync waits for it without another call

        def call(i, jf=jf, last=last):
            last[:] = [jf(x, w, st, dy)]
        print(kernel_table(call, iters, lambda last=last: jax.block_until_ready(last[0])))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--features", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--frameworks", default="torch,jax")
    args = ap.parse_args()
    for fw in args.frameworks.split(","):
        {"torch": torch_tables, "jax": jax_tables}[fw](args.tokens, args.features, args.iters)


if __name__ == "__main__":
    main()
