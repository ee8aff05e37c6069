"""How every benchmark in the suite is timed (one place, so every row is
measured the same way).

    1. Warm-up: each function runs a few times first (compilation, cuBLASLt
       plan builds and algorithm choice, allocator growth happen here).
    2. Calibration: a few calls give the number of back-to-back calls that
       fill one timed batch of about `batch_seconds`.
    3. Rounds: each round times one batch of every function in turn
       (fp8kit, anchor, fp8kit, anchor, ...), so slow drifts of a shared
       machine (clocks, other jobs) hit both alike. The median round counts.
       The first round takes the functions in the order given, each later
       one in a shuffled order (seeded: the same every run): a GPU held at
       its power cap changes its clock from one batch to the next, and a
       function always timed right after the same heavy neighbour would
       carry that neighbour's effect on the clock in every round.

Clocks: PyTorch on CUDA uses CUDA events on the current stream around the
batch (GPU time of back-to-back calls, launch gaps included - which is
what per-call overhead is). JAX and CPU work use the wall clock around the
batch, ending with a sync (jax.block_until_ready, torch.cuda.synchronize).

L2: a function that reads small operands again and again is served from
L2 (50 MB on an H200) and looks faster than real use. `copies_for_l2`
says how many copies of an input set to rotate through (call i uses copy
i % n) so that one pass touches at least L2_DEFEAT_BYTES.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import statistics
import time
from typing import Callable, ContextManager, Dict, Optional

L2_DEFEAT_BYTES = 256 << 20  # > 5x the H200's 50 MB L2
MAX_COPIES = 8


def copies_for_l2(bytes_per_set: int, defeat_bytes: int = L2_DEFEAT_BYTES) -> int:
    """Copies of an input set so that rotating through them touches
    defeat_bytes (at most MAX_COPIES; 1 for sets already that large)."""
    return max(1, min(MAX_COPIES, math.ceil(defeat_bytes / max(1, bytes_per_set))))


@dataclasses.dataclass(frozen=True)
class Settings:
    warmup: int = 3             # untimed calls per function
    rounds: int = 7             # timed batches per function (median taken)
    batch_seconds: float = 0.025
    min_iters: int = 5
    max_iters: int = 1000

    @staticmethod
    def quick() -> "Settings":
        return Settings(warmup=1, rounds=3, batch_seconds=0.002, min_iters=1, max_iters=3)


@dataclasses.dataclass(frozen=True)
class Timing:
    median_s: float             # seconds per call, median over rounds
    min_s: float
    rounds: int
    iters: int                  # calls per round
    gpu: Optional[dict] = None  # mean SM clock and power during the timed batches (GpuSampler)

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        if d["gpu"] is None:
            del d["gpu"]
        return d


class Clock:
    """Times `iters` back-to-back calls fn(0), fn(1), ...; returns seconds per call."""

    def batch(self, fn: Callable[[int], object], iters: int) -> float:
        raise NotImplementedError

    def sync(self, out) -> None:
        raise NotImplementedError


class WallClock(Clock):
    """perf_counter around the batch; `sync(out)` waits for the device."""

    def __init__(self, sync: Callable[[object], None] = lambda out: None):
        self._sync = sync

    def sync(self, out) -> None:
        self._sync(out)

    def batch(self, fn, iters):
        self._sync(None)
        t0 = time.perf_counter()
        out = None
        for i in range(iters):
            out = fn(i)
        self._sync(out)
        return (time.perf_counter() - t0) / iters


class CudaEventClock(Clock):
    """CUDA events on PyTorch's current stream around the batch."""

    def __init__(self):
        import torch
        self._torch = torch

    def sync(self, out) -> None:
        self._torch.cuda.synchronize()

    def batch(self, fn, iters):
        torch = self._torch
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(iters):
            fn(i)
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) / 1e3 / iters


def torch_clock(device) -> Clock:
    import torch
    if torch.device(device).type == "cuda":
        return CudaEventClock()
    return WallClock()


def jax_clock() -> Clock:
    import jax
    return WallClock(lambda out: None if out is None else jax.block_until_ready(out))


def measure(fns: Dict[str, Callable[[int], object]], clock: Clock, settings: Settings,
            around: Optional[Dict[str, Callable[[], ContextManager]]] = None,
            sampler=None) -> Dict[str, Timing]:
    """Median seconds per call of each function (see the module doc).

    Each function takes the call index (to rotate through input copies).
    around[name], when given, makes a context entered around each of that
    function's batches, outside the timed region (e.g. one autocast around
    many layer calls, as in a model's forward). sampler, a running
    gpu_monitor.GpuSampler, gives each Timing the GPU's mean SM clock and
    power during that function's timed batches."""
    around = around or {}
    windows = {name: [] for name in fns}

    def ctx(name):
        return around[name]() if name in around else contextlib.nullcontext()

    for name, fn in fns.items():
        out = None
        with ctx(name):
            for i in range(settings.warmup):
                out = fn(i)
            clock.sync(out)
    iters = {}
    for name, fn in fns.items():
        with ctx(name):
            t = clock.batch(fn, max(1, min(3, settings.max_iters)))
        iters[name] = max(settings.min_iters,
                          min(settings.max_iters, int(settings.batch_seconds / max(t, 1e-9))))
    samples = {name: [] for name in fns}
    for names in round_orders(list(fns), settings.rounds):
        for name in names:
            fn = fns[name]
            with ctx(name):
                t0 = time.monotonic()
                samples[name].append(clock.batch(fn, iters[name]))
                windows[name].append((t0, time.monotonic()))
    return {name: Timing(median_s=statistics.median(v), min_s=min(v), rounds=len(v),
                         iters=iters[name],
                         gpu=sampler.mean_over(windows[name]) if sampler else None)
            for name, v in samples.items()}


def round_orders(names: list, rounds: int) -> list:
    """The order of the functions in each round: as given in the first,
    then shuffled with a fixed seed (the module's doc says why)."""
    shuffle = random.Random(0)
    orders = [list(names)]
    for _ in range(rounds - 1):
        orders.append(shuffle.sample(names, len(names)))
    return orders[:rounds]


# Batches long enough for each function to reach its own steady state: a
# large FP8 layer run back to back holds the GPU at its power cap, at a lower
# clock than in a 25 ms batch that follows other work (gpu_monitor.py).
SUSTAINED = Settings(warmup=3, rounds=3, batch_seconds=1.5, min_iters=5, max_iters=100_000)


def measure_sustained(fns: Dict[str, Callable[[int], object]], clock: Clock, quick: bool,
                      around: Optional[Dict[str, Callable[[], ContextManager]]] = None
                      ) -> Dict[str, Timing]:
    """measure() with SUSTAINED batches (Settings.quick() in quick mode),
    recording the GPU's clock and power where nvidia-smi is available."""
    from fp8kit.bench.gpu_monitor import GpuSampler
    settings = Settings.quick() if quick else SUSTAINED
    if not GpuSampler.available():
        return measure(fns, clock, settings, around)
    with GpuSampler() as sampler:
        return measure(fns, clock, settings, around, sampler)


def gpu_note(kit: Timing, anchor: Timing) -> str:
    """'GPU during fp8kit / anchor batches: ...' from two sampled Timings."""
    if kit.gpu is None or anchor.gpu is None:
        return "GPU clock and power not sampled (no nvidia-smi)"
    return (f"GPU during fp8kit / anchor batches: SM {kit.gpu['sm_mhz']} / "
            f"{anchor.gpu['sm_mhz']} MHz, {kit.gpu['power_w']} / {anchor.gpu['power_w']} W")


def host_seconds(fns: Dict[str, Callable[[int], object]], clock: Clock, iters: int,
                 around: Optional[Dict[str, Callable[[], ContextManager]]] = None
                 ) -> Dict[str, float]:
    """Host (CPU) seconds per call of each function: perf_counter around
    `iters` back-to-back calls without waiting for the device, then a sync.
    On a GPU this is the launch cost a busy GPU hides and an idle one
    waits for (per-call overhead); on the CPU it is the whole call. Run
    after measure(), so everything is warm."""
    around = around or {}
    out = {}
    for name, fn in fns.items():
        with around[name]() if name in around else contextlib.nullcontext():
            clock.sync(None)
            t0 = time.perf_counter()
            res = None
            for i in range(iters):
                res = fn(i)
            out[name] = (time.perf_counter() - t0) / iters
            clock.sync(res)
    return out
