"""Thread stress: 8 threads hammer fp8kit at once - the quantizers, the
GEMM (its plan cache, over many shapes), Linear forward/backward, one
Linear shared under autocasts with different recipes, and fp8kit.jax's
custom calls - and every result must equal, bit for bit, the result the
same call gave on one thread. Each test is bounded by a fixed number of
calls. Run in a child process by test_thread_stress.py."""

from __future__ import annotations

import copy
import os
import sys
import threading

import numpy as np
import pytest
import torch

import fp8kit.torch as ft
from fp8kit.recipe import AmaxReduction, CurrentScaling, DelayedScaling, Format
from fp8_strategies import SCALE
from torch_support import device_or_skip

THREADS = 8


def _as_bytes(result):
    """Any nesting of tensors / Float8Tensors / arrays as a tuple of bytes."""
    if isinstance(result, (tuple, list)):
        return tuple(b for r in result for b in _as_bytes(r))
    if result is None:
        return (b"",)
    if isinstance(result, ft.Float8Tensor):
        return _as_bytes((result.rowwise_data, result.columnwise_data, result.scale_inv))
    if isinstance(result, torch.Tensor):
        t = result.detach()
        if t.device.type == "cuda":
            torch.cuda.current_stream().synchronize()
        return (t.cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes(),)
    return (np.ascontiguousarray(np.asarray(result)).view(np.uint8).tobytes(),)


def hammer(calls, rounds: int, what: str):
    """Runs every call once on this thread (the expected bytes), then on
    THREADS threads at once, each `rounds` times over all calls in its own
    rotated order (scaled like the hypothesis examples,
    FP8KIT_HARDENING_EXAMPLES: compute-sanitizer runs a quarter); fails
    listing the calls whose bytes differ."""
    rounds = max(1, round(rounds * SCALE))
    expected = [_as_bytes(c()) for c in calls]
    errors, lock = [], threading.Lock()
    start = threading.Barrier(THREADS)

    def worker(i):
        start.wait()
        try:
            for r in range(rounds):
                for j in range(len(calls)):
                    k = (j + i * 7 + r) % len(calls)
                    if _as_bytes(calls[k]()) != expected[k]:
                        with lock:
                            errors.append(f"thread {i}, round {r}: call {k} differs")
        except Exception as e:  # noqa: BLE001 - reported below
            with lock:
                errors.append(f"thread {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    # Python switches threads every 5 ms by default, longer than most of
    # these calls: switch as often as possible, so that a race between the
    # Python steps of a call shows within a bounded number of calls.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, f"{what}: {len(errors)} results differ from one thread's:\n" + \
        "\n".join(errors[:20])


def _inputs(device, count, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(16, 32), (3, 5, 16), (128, 64), (1, 48), (0, 16), (64, 128), (7,), ()]
    return [(torch.randn(shapes[i % len(shapes)], generator=g) * 2.0 ** (i % 9 - 4)).to(device)
            for i in range(count)]


def check_quantizers(device):
    dev = device_or_skip(device)
    xs = _inputs(dev, 16)
    current = ft.Float8CurrentScalingQuantizer("e4m3", True, True)
    pow2 = ft.Float8CurrentScalingQuantizer("e5m2", True, False, 1e-3, True)
    delayed = ft.Float8Quantizer(torch.full((1,), 3.0, device=dev), "e4m3", None, True, True)
    calls = []
    for x in xs:
        calls += [lambda x=x: current(x), lambda x=x: pow2(x), lambda x=x: delayed(x),
                  lambda x=x: ft.quantize_current_scaling(x, "e5m2", True, True),
                  lambda x=x: ft.amax(x)]
    hammer(calls, rounds=6, what="quantizers")


def _gemm_calls(device):
    """FP8 GEMMs of many shapes, layouts and output types: each new
    combination is a new plan in the cache."""
    g = torch.Generator().manual_seed(1)
    calls = []
    for i, (m, k, n) in enumerate([(16, 16, 16), (32, 64, 16), (48, 32, 64), (1, 16, 8),
                                   (17, 48, 24), (64, 128, 32), (5, 32, 40), (128, 16, 16)]):
        for trans_a, trans_b, out in ((False, True, torch.bfloat16), (False, False, torch.float32),
                                      (True, False, torch.float16)):
            a = torch.randn((k, m) if trans_a else (m, k), generator=g).to(device)
            b = torch.randn((n, k) if trans_b else (k, n), generator=g).to(device)
            ad, acw, _, asi, _ = ft.quantize_current_scaling(a, "e4m3", True, True)
            bd, bcw, _, bsi, _ = ft.quantize_current_scaling(b, "e5m2" if i % 2 else "e4m3",
                                                             True, True)
            calls.append(lambda ad=ad, acw=acw, asi=asi, bd=bd, bcw=bcw, bsi=bsi, ta=trans_a,
                         tb=trans_b, out=out: ft.gemm(ad, asi, acw, bd, bsi, bcw, ta, tb, out))
    return calls


def check_gemm_plan_cache(device):
    dev = device_or_skip(device)
    hammer(_gemm_calls(dev), rounds=4, what="gemm")


RECIPES = [CurrentScaling(), CurrentScaling(fp8_format=Format.E4M3, power_2_scale=True),
           DelayedScaling(amax_history_len=4),
           DelayedScaling(fp8_format=Format.E4M3, margin=2,
                          amax_reduction=AmaxReduction.MOST_RECENT)]


def _training_run(layer, recipe, xs, dys):
    """A few forward/backward steps of one layer: every output and gradient."""
    out = []
    for x, dy in zip(xs, dys):
        layer.zero_grad(set_to_none=True)
        x = x.clone().requires_grad_()
        with ft.autocast(recipe=recipe):
            y = layer(x)
        y.backward(dy)
        out += [y, x.grad, layer.weight.grad, layer.bias.grad]
    return out


def _backward_threads_or_skip(device):
    """compute-sanitizer (2025.3) deadlocks inside the CUDA driver when the
    autograd engine's CUDA thread launches a kernel while another thread
    allocates: one thread waits in the tool's handling of the launch, the
    other for the driver's lock in cuMemAlloc (native stacks in the
    sanitizer results' history, `git log -- docs/results`; no fp8kit lock or
    GIL in the cycle).
    Without the tool these checks pass. Under the GPU sanitizer stage
    (FP8KIT_HARDENING_UNDER_SANITIZER=1) the checks that run backward on
    several threads at once skip on a GPU; the same kernels are sanitized in
    tests/torch/test_torch_linear.py."""
    if device == "cuda" and os.environ.get("FP8KIT_HARDENING_UNDER_SANITIZER"):
        pytest.skip("backward on several threads at once deadlocks compute-sanitizer in the "
                    "CUDA driver (a tool-driver lock cycle, not an fp8kit lock)")


def check_linear_forward_backward(device):
    """Each thread trains its own copy of a Linear (same start, same data):
    forward outputs and gradients equal one thread's, for every recipe."""
    _backward_threads_or_skip(device)
    dev = device_or_skip(device)
    torch.manual_seed(2)
    base = ft.Linear(64, 32, device=dev)
    xs = [torch.randn(24, 64, device=dev) * 2.0 ** s for s in (0, 3, -2)]
    dys = [torch.randn(24, 32, device=dev) * 1e-2 for _ in xs]

    # Each call trains a fresh copy, so the calls are independent of their
    # order; the threads share the module-level caches and the autograd engine.
    calls = [lambda r=r: _training_run(copy.deepcopy(base), r, xs, dys) for r in RECIPES]
    hammer(calls, rounds=3, what="Linear forward/backward")


def check_shared_linear_mixed_recipes(device):
    """One Linear shared by all threads, each call under its own recipe:
    current scaling with gradients (stateless), delayed scaling without
    (casts with a fresh slot's own amax and records nothing), so every
    result is fixed - and a call must never see another thread's recipe."""
    _backward_threads_or_skip(device)
    dev = device_or_skip(device)
    torch.manual_seed(3)
    layer = ft.Linear(64, 32, device=dev)
    x = torch.randn(16, 64, device=dev)
    dy = torch.randn(16, 32, device=dev)

    def with_grad(recipe):
        xi = x.clone().requires_grad_()
        with ft.autocast(recipe=recipe):
            y = layer(xi)
        (dx,) = torch.autograd.grad(y, xi, dy)
        return y, dx

    def no_grad(recipe):
        with torch.no_grad(), ft.autocast(recipe=recipe):
            return layer(x)

    # amax_epsilon above x's amax: a scale that is no power of two away from
    # the first recipe's, so the two give different outputs and a call run
    # with the other thread's recipe shows.
    distinct = CurrentScaling(amax_epsilon=100.0)
    calls = [lambda: with_grad(RECIPES[0]), lambda: with_grad(distinct),
             lambda: no_grad(RECIPES[2]), lambda: no_grad(RECIPES[3]),
             lambda: no_grad(RECIPES[1])]
    assert _as_bytes(calls[0]()) != _as_bytes(calls[1]()), "the test cannot tell the recipes apart"
    hammer(calls, rounds=200, what="one Linear under mixed recipes")


def check_jax_custom_calls(device):
    """fp8kit.jax's quantize / amax / gemm / dense from 8 threads at once."""
    import jax
    import jax.numpy as jnp
    import fp8kit.jax as fj
    device_or_skip(device)
    jdev = jax.devices("gpu")[0] if device == "cuda" else jax.devices("cpu")[0]
    rng = np.random.default_rng(4)
    xs = [jax.device_put(jnp.asarray(rng.standard_normal(s).astype(np.float32)), jdev)
          for s in ((16, 32), (48, 64), (5, 16), (0, 16))]
    kernel = jax.device_put(jnp.asarray(rng.standard_normal((32, 16)).astype(np.float32)), jdev)
    recipe = CurrentScaling()
    dense_grad = jax.jit(jax.grad(lambda x, k: jnp.sum(fj.dense(x, k, recipe=recipe)),
                                  argnums=(0, 1)))
    calls = []
    for x in xs:
        calls += [lambda x=x: fj.quantize_current_scaling(x, "e4m3", True, True)[0].data,
                  lambda x=x: fj.amax(x),
                  lambda x=x: fj.quantize(x, jnp.float32(2.0), "e5m2").data]
    a, _ = fj.quantize_current_scaling(xs[1], "e4m3", True, True)
    calls += [lambda: fj.gemm(a, a, False, True, jnp.float32),
              lambda: dense_grad(xs[0], kernel)]
    hammer(calls, rounds=6, what="fp8kit.jax custom calls")
