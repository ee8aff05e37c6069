"""Host time per call of the pieces of a small FP8 Linear step on a GPU.

A launch-bound call's time is its host time: this times N back-to-back calls
with the wall clock (then one synchronize) for each piece of the forward
path (allocation, one kernel launch, quantize, GEMM, the delayed-scaling
update, the whole linear_forward) next to torch's own bf16 and _scaled_mm
calls, so the per-call budget of ANCHORS.md P4 can be split into parts.

    python scripts/host_probe.py [--tokens 16 --features 1024 --iters 2000]
"""

import argparse
import time

import torch
import torch.nn.functional as F

import fp8kit.torch as ft
from fp8kit.torch._ext import ext


def per_call_us(fn, iters):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    return host / iters * 1e6, wall / iters * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--features", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=2000)
    args = ap.parse_args()
    dev = torch.device("cuda")
    m, k = args.tokens, args.features
    n = k
    torch.manual_seed(0)
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    xg = x.clone().requires_grad_(True)
    lin = torch.nn.Linear(k, n, device=dev, dtype=torch.bfloat16)
    w, b = lin.weight, lin.bias
    f8 = ft.Linear(k, n, device=dev, dtype=torch.bfloat16)
    scale = torch.ones(4, device=dev)[:1]
    amax = torch.zeros(4, device=dev)[:1]
    xq, _, xs = ext.quantize(x, scale, "e4m3", True, False, amax)
    wq, _, ws = ext.quantize(w.detach(), scale, "e4m3", True, False, amax)
    one = torch.ones((), device=dev)
    tiny = torch.zeros(1, device=dev)
    hist = [torch.zeros(16, device=dev) for _ in range(3)]
    amaxes = [torch.zeros(1, device=dev) for _ in range(3)]
    scales = [torch.ones(1, device=dev) for _ in range(3)]
    sinvs = [torch.ones(1, device=dev) for _ in range(3)]
    recipe = ft.DelayedScaling()
    g = torch.randn(m, n, device=dev, dtype=torch.bfloat16)

    def fp8_fwd():
        return f8(xg)

    def fp8_fwd_bwd():
        f8(xg).backward(g)

    def bf16_fwd_bwd():
        lin(xg).backward(g)

    with ft.autocast(recipe=recipe):
        f8(xg)  # creates the layer's FP8 state
    st = f8.fp8_state
    pieces = [
        ("torch.empty fp8 [m,k]", lambda: torch.empty(m, k, device=dev, dtype=torch.float8_e4m3fn)),
        ("one kernel launch (tiny.zero_())", lambda: tiny.zero_()),
        ("F.linear bf16, no grad", lambda: F.linear(x, w.detach(), b.detach())),
        ("nn.Linear bf16 module, grad", lambda: lin(xg)),
        ("torch._scaled_mm e4m3", lambda: torch._scaled_mm(xq, wq.t(), one, one,
                                                           out_dtype=torch.bfloat16)),
        ("ext.quantize rowwise (delayed)", lambda: ext.quantize(x, scale, "e4m3", True, False,
                                                                amax)),
        ("ext.quantize row+col (delayed)", lambda: ext.quantize(x, scale, "e4m3", True, True,
                                                                amax)),
        ("ext.gemm TN e4m3 -> bf16", lambda: ext.gemm(xq, xs, None, wq, ws, None, False, True)),
        ("ext.delayed_scaling_update x3", lambda: ext.delayed_scaling_update(
            hist, amaxes, scales, sinvs, ["e4m3"] * 3)),
        ("ext.linear_forward, no grad", lambda: ext.linear_forward(st, x, w.detach(), b.detach())),
        ("ext.linear_forward, grad", lambda: ext.linear_forward(st, xg, f8.weight, f8.bias)),
    ]
    print(f"host us per call (wall us incl. GPU), {m}x{k}x{n}, {args.iters} calls")
    for name, fn in pieces:
        h, wl = per_call_us(fn, args.iters)
        print(f"  {name:40s} {h:8.2f}  ({wl:8.2f})")
    with ft.autocast(recipe=recipe):
        for name, fn in [("fp8kit Linear fwd (in autocast)", fp8_fwd),
                         ("fp8kit Linear fwd+bwd", fp8_fwd_bwd)]:
            h, wl = per_call_us(fn, args.iters)
            print(f"  {name:40s} {h:8.2f}  ({wl:8.2f})")
    h, wl = per_call_us(bf16_fwd_bwd, args.iters)
    print(f"  {'nn.Linear bf16 fwd+bwd':40s} {h:8.2f}  ({wl:8.2f})")


if __name__ == "__main__":
    main()
