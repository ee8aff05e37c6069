"""Is this GPU's FP8 speed set by its power cap, and does it depend on the
operands' values?

The power a GPU draws, and so the SM clock it can hold under its power cap,
depends on the bits its tensor cores toggle. A GEMM or a layer that runs
slower than a reference measurement on the same model of GPU, while the
same kernel runs in both, is often this: the GPU is at its power cap
(nvidia-smi -q -d PERFORMANCE: "SW Power Cap: Active") at a lower clock.
This tool times rows alternately in one process, in batches of about
--seconds each, with the SM clock and board power nvidia-smi samples
during each batch:
  gemm    torch._scaled_mm at size^3 (no fp8kit code) on e4m3 operands made
          from normal data scaled to the e4m3 range (as the bench's GEMM
          rows do), from unscaled randn (|x| < ~5: few exponents used), from
          uniform data scaled to the range, and zeros;
  linear  the fwd+bwd step of bf16 nn.Linear and fp8kit.torch.Linear
          (delayed scaling) with nn.Linear's uniform init and with normal
          weights of the same standard deviation.
docs/results/power_cap.txt is its output on an H200;
docs/benchmarks.md reads it.

    python scripts/power_cap.py [--what gemm,linear] [--size 8192]
                                [--seconds 1.5] [--rounds 3]
"""

import argparse
import time

import torch

from fp8kit.bench import timing, torch_layers
from fp8kit.bench.gemm import quantize_e4m3
from fp8kit.bench.gpu_monitor import GpuSampler
from fp8kit.recipe import DelayedScaling


def cuda_ms_per_call(fn, seconds: float) -> float:
    """ms per call of fn over about `seconds` of back-to-back calls (long
    enough for nvidia-smi's samples to see the load)."""
    clock = timing.CudaEventClock()
    estimate = clock.batch(fn, 5)
    return 1e3 * clock.batch(fn, max(10, int(seconds / estimate)))


def gemm_cases(s: int) -> dict:
    """{data name: call i -> torch._scaled_mm} on e4m3 operands [s, s]."""
    fp8 = torch.float8_e4m3fn
    g = torch.Generator(device="cuda").manual_seed(0)

    def scaled(x):  # per-tensor scale to the e4m3 range, as the bench's GEMM rows do
        q, scale_inv = quantize_e4m3(x)
        return q, scale_inv.reshape(())

    def normal():
        return torch.randn(s, s, device="cuda", generator=g, dtype=torch.bfloat16)

    def uniform():
        return torch.rand(s, s, device="cuda", generator=g, dtype=torch.bfloat16) * 2 - 1

    one = torch.ones((), device="cuda")
    operands = {
        "normal, scaled to e4m3 max": (scaled(normal()), scaled(normal())),
        "randn cast unscaled": ((normal().to(fp8), one), (normal().to(fp8), one)),
        "uniform, scaled to e4m3 max": (scaled(uniform()), scaled(uniform())),
        "zeros": ((torch.zeros(s, s, device="cuda", dtype=fp8), one),) * 2,
    }
    cases = {}
    for name, ((a, sa), (b, sb)) in operands.items():
        cases[name] = (lambda i, a=a, b=b, sa=sa, sb=sb: torch._scaled_mm(
            a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16))
    return cases, 2 * s ** 3


def linear_cases(s: int) -> dict:
    """{(init, layer): call i -> fwd+bwd step}: fresh layers per init, so the
    delayed-scaling history of one init does not set the other's scales."""
    data = torch_layers.inputs(s, s, s, "cuda", copies=2, seed=1)
    cases, std = {}, None
    for init in ("uniform", "normal"):
        layers = torch_layers.make_layers(s, s, "cuda", seed=0)
        w = layers["bf16"].weight.detach()
        std = w.float().std() if std is None else std
        if init == "normal":
            w = torch.randn(w.shape, device="cuda").mul_(std).to(w.dtype)
        with torch.no_grad():
            for layer in layers.values():
                layer.weight.copy_(w)
        cases[f"{init} init, bf16"] = torch_layers.fwd_bwd_fn(layers["bf16"], data)
        cases[f"{init} init, fp8kit"] = torch_layers.fwd_bwd_fn(layers["fp8kit"], data,
                                                               DelayedScaling())
    return cases, 3 * 2 * s ** 3


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--what", default="gemm,linear")
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--seconds", type=float, default=1.5, help="per row")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    for what in args.what.split(","):
        cases, flops = {"gemm": gemm_cases, "linear": linear_cases}[what](args.size)
        print(f"== {what}, {args.size}^3, {args.seconds:g} s per row", flush=True)
        for r in range(args.rounds):
            for name, fn in cases.items():
                with GpuSampler() as sampler:
                    t0 = time.monotonic()
                    ms = cuda_ms_per_call(fn, args.seconds)
                    gpu = sampler.mean_over([(t0, time.monotonic())]) or {}
                print(f"round {r}  {name:30s} {ms:7.3f} ms  {flops / ms / 1e9:7.1f} TFLOP/s"
                      f"  SM {gpu.get('sm_mhz', '?')} MHz  {gpu.get('power_w', '?')} W", flush=True)
        del cases
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
