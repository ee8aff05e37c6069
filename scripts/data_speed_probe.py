"""Does the speed of a large Linear step depend on the weights' values?

The kernel profiles of one 8192^3 step (scripts/kernel_profile.py) ran the
same cuBLASLt FP8 kernel 10% faster in the JAX step (weights drawn from a
normal distribution) than in the torch step (nn.Linear's uniform init), and
the torch step's gradient GEMMs, which do not read the weight, were slower
too. An H200 running FP8 GEMMs can be power-limited, and the power drawn
depends on the bits the tensor cores toggle; this probe measures that
directly: the fwd+bwd step of bf16 nn.Linear and of fp8kit.torch.Linear
(delayed scaling) with (a) nn.Linear's uniform init and (b) normal weights
of the same standard deviation, timed alternately in one process, with the
SM clock and board power nvidia-smi reports during each.

    python scripts/weight_init_probe.py [--size 8192] [--iters 50] [--rounds 3]
"""

import argparse
import subprocess
import time

import torch

from fp8kit.bench import torch_layers
from fp8kit.recipe import DelayedScaling


def sample_gpu(seconds_fn):
    """Runs seconds_fn() while nvidia-smi samples SM clock (MHz) and power
    (W) every 50 ms; returns (result, mean clock, mean power)."""
    mon = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw",
                            "--format=csv,noheader,nounits", "-lms", "50"],
                           stdout=subprocess.PIPE, text=True)
    time.sleep(0.2)
    try:
        result = seconds_fn()
    finally:
        mon.terminate()
        out, _ = mon.communicate()
    rows = [[float(v) for v in line.split(",")] for line in out.splitlines()[4:] if "," in line]
    if not rows:
        return result, float("nan"), float("nan")
    return result, sum(r[0] for r in rows) / len(rows), sum(r[1] for r in rows) / len(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    s = args.size
    data = torch_layers.inputs(s, s, s, "cuda", copies=2, seed=1)
    recipe = DelayedScaling()
    steps = {}  # (init, layer name) -> step; fresh layers per init, so the
    # delayed-scaling history of one init does not set the other's scales
    uniform = None
    for init in ("uniform", "normal"):
        layers = torch_layers.make_layers(s, s, "cuda", seed=0)
        w = layers["bf16"].weight.detach()
        if uniform is None:
            uniform = w.float().std()
        if init == "normal":
            w = torch.randn(w.shape, device="cuda").mul_(uniform).to(w.dtype)
        with torch.no_grad():
            for layer in layers.values():
                layer.weight.copy_(w)
        steps[init, "bf16"] = torch_layers.fwd_bwd_fn(layers["bf16"], data)
        steps[init, "fp8kit"] = torch_layers.fwd_bwd_fn(layers["fp8kit"], data, recipe)
    flops = 3 * 2 * s ** 3

    def timed(step):
        for i in range(5):
            step(i)
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(args.iters):
            step(i)
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) / args.iters

    print(f"fwd+bwd {s}^3, {args.iters} steps per row; weight std {float(uniform):.3g}")
    for r in range(args.rounds):
        for (init, name), step in steps.items():
            ms, clock, power = sample_gpu(lambda: timed(step))
            print(f"round {r} {init:8s} {name:7s} {ms:7.3f} ms  {flops / ms / 1e9:7.1f} TFLOP/s"
                  f"  SM {clock:6.0f} MHz  {power:5.0f} W", flush=True)

if __name__ == "__main__":
    main()
