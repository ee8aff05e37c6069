"""How far is the FP8 GEMM's output from the exact product, with split
(FP32-promoted) and with fast accumulation?

For e4m3 x e4m3 at m x k x n (normal inputs; normal and uniform weights;
with and without the bias epilogue) it quantizes both operands with
per-tensor scales, runs fp8kit's GEMM in both accumulation modes and prints
||D - exact|| / ||exact||, where exact is the float64 product of the same
dequantized FP8 values: only the GEMM's accumulation and its bf16 output
rounding count, not the quantization. The last line is the error of the
bf16 rounding alone, for scale. On the CPU both modes run fp8kit's
reference GEMM, so they agree; the question is about the GPU's tensor cores.

    python scripts/accumulation_error.py [--m 8192 --k 8192 --n 8192] [--device cuda]
"""

import argparse

import torch

import fp8kit.torch as ft
from fp8kit.bench.gemm import quantize_e4m3 as quantize


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, default=8192)
    ap.add_argument("--k", type=int, default=8192)
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    g = torch.Generator(a.device).manual_seed(0)
    x = torch.randn(a.m, a.k, device=a.device, generator=g)
    bound = a.k ** -0.5
    weights = {"normal": torch.randn(a.n, a.k, device=a.device, generator=g) * bound,
               "uniform": (torch.rand(a.n, a.k, device=a.device, generator=g) * 2 - 1) * bound}
    bias = (torch.rand(a.n, device=a.device, generator=g) * 2 - 1) * bound
    xq, xs = quantize(x)
    for wname, w in weights.items():
        wq, ws = quantize(w)
        exact = (xq.double() * xs.double()) @ (wq.double() * ws.double()).T
        for with_bias in (False, True):
            want = exact + bias.bfloat16().double() if with_bias else exact
            for split in (True, False):
                d = ft.gemm(xq, xs, None, wq, ws, None, trans_b=True,
                            out_dtype=torch.bfloat16,
                            bias=bias.bfloat16() if with_bias else None,
                            use_split_accumulator=split)
                err = ((d.double() - want).norm() / want.norm()).item()
                print(f"{a.m}x{a.k}x{a.n} weights {wname:7s} bias {with_bias!s:5s} "
                      f"{'split' if split else 'fast '}: rel err {err:.2e}")
    # bf16 output rounding alone, for scale:
    print("bf16 rounding of the exact product:",
          f"{((exact.bfloat16().double() - exact).norm() / exact.norm()).item():.2e}")


if __name__ == "__main__":
    main()
