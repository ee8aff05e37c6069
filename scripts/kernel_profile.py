"""Where the GPU time of one large Linear training step goes (issue 6, P3).

torch.profiler over ITERS fwd+bwd calls of fp8kit.torch.Linear (delayed
scaling, weight re-quantized every call) and of bf16 torch.nn.Linear at
tokens x features x features, printed as a table of CUDA kernels sorted by
total GPU time. The kernel times, not the wall time, are the point: which
GEMM ran how long, and what the casts and the bias-gradient sum cost.

    python scripts/kernel_profile.py [--tokens 8192 --features 8192 --iters 10]
"""

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

import fp8kit.torch as ft
from fp8kit.bench import torch_layers
from fp8kit.recipe import DelayedScaling


def kernel_table(fn, iters: int) -> str:
    for i in range(3):
        fn(i)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(iters):
            fn(i)
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=15,
                                     max_name_column_width=90)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--features", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    t, f = args.tokens, args.features
    layers = torch_layers.make_layers(f, f, "cuda", seed=0)
    layers["fp8kit"].cache_fp8_weight = False
    data = torch_layers.inputs(t, f, f, "cuda", copies=1, seed=0)
    for name, layer in layers.items():
        fn = torch_layers.fwd_bwd_fn(layer, data)
        with ft.autocast(enabled=name == "fp8kit", recipe=DelayedScaling()):
            print(f"== {name}: {args.iters} x fwd+bwd, {t}x{f}x{f}, CUDA time per kernel")
            print(kernel_table(fn, args.iters))


if __name__ == "__main__":
    main()
