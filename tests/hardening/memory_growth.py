"""Memory growth: 50,000 quantizer calls and 5,000 Linear training steps on
small tensors must not grow the process's resident memory (RSS) beyond a
fixed slack once warmed up. Run by test_memory_growth.py, each check in a
fresh child process of its own so that no other test's allocations count.

The slack, GROWTH_SLACK_BYTES = 8 MiB: after the warm-up (which fills the
allocators' caches and the extension's per-shape caches) RSS moves by
about 1 MiB either way from allocator noise. A leak of one small object
per call is caught: 50,000 quantizer calls leaking 200 bytes each is
10 MB, 5,000 steps leaking a [16, 32] float32 tensor each is 10 MB.
With CUDA, device memory allocated by torch must come back exactly.
"""

from __future__ import annotations

import gc
import os

import torch

import fp8kit.torch as ft
from fp8kit.recipe import CurrentScaling, DelayedScaling
from torch_support import device_or_skip

GROWTH_SLACK_BYTES = 8 << 20
QUANTIZER_CALLS = 50_000
LINEAR_STEPS = 5_000

torch.set_num_threads(1)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _measure(step, count: int, warmup: int, device):
    """RSS (and CUDA memory) growth of `count` calls of step(i) after
    `warmup` calls."""
    for i in range(warmup):
        step(i)
    gc.collect()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    rss0, dev0 = rss_bytes(), torch.cuda.memory_allocated() if cuda else 0
    for i in range(count):
        step(i)
    gc.collect()
    if cuda:
        torch.cuda.synchronize()
    return rss_bytes() - rss0, (torch.cuda.memory_allocated() - dev0) if cuda else 0


def check_quantizer_calls(device):
    dev = device_or_skip(device)
    xs = [torch.randn(16, 32, device=dev), torch.randn(3, 5, 16, device=dev).bfloat16(),
          torch.randn(32, 16, device=dev).t()]
    scale, amax = torch.full((1,), 4.0, device=dev), torch.zeros(1, device=dev)
    quantizers = [ft.Float8CurrentScalingQuantizer("e4m3", True, True),
                  ft.Float8Quantizer(scale, "e5m2", amax, True, True),
                  ft.Float8CurrentScalingQuantizer("e5m2", False, True, 1e-3, True)]
    dst = quantizers[1](xs[0])

    def step(i):
        kind = i % 5
        x = xs[i % len(xs)]
        if kind < 3:
            f8 = quantizers[kind](x)
            if i % 50 == 0:
                f8.dequantize()
        elif kind == 3:
            quantizers[1].update_quantized(xs[0], dst)
        else:
            ft.quantize_current_scaling(x, "e4m3", True, True)

    grown, device_grown = _measure(step, QUANTIZER_CALLS, 2_000, dev)
    assert grown <= GROWTH_SLACK_BYTES, (
        f"RSS grew by {grown / 2**20:.1f} MiB over {QUANTIZER_CALLS} quantizer calls "
        f"(slack {GROWTH_SLACK_BYTES >> 20} MiB)")
    assert device_grown == 0, f"CUDA memory grew by {device_grown} bytes"


def check_linear_steps(device):
    dev = device_or_skip(device)
    torch.manual_seed(0)
    layers = [ft.Linear(32, 16, device=dev), ft.Linear(32, 16, device=dev)]
    recipes = [DelayedScaling(amax_history_len=8), CurrentScaling()]
    opts = [torch.optim.SGD(layer.parameters(), lr=1e-3) for layer in layers]
    x = torch.randn(16, 32, device=dev)

    def step(i):
        j = i % 2
        opts[j].zero_grad(set_to_none=True)
        with ft.autocast(recipe=recipes[j]):
            y = layers[j](x)
        y.square().mean().backward()
        opts[j].step()

    grown, device_grown = _measure(step, LINEAR_STEPS, 500, dev)
    assert grown <= GROWTH_SLACK_BYTES, (
        f"RSS grew by {grown / 2**20:.1f} MiB over {LINEAR_STEPS} Linear steps "
        f"(slack {GROWTH_SLACK_BYTES >> 20} MiB)")
    assert device_grown == 0, f"CUDA memory grew by {device_grown} bytes"
