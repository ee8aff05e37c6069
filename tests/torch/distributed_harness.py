"""Runs a test's worker function on N ranks of torch.distributed, each in a
process spawned from pytest, and returns what every rank's worker returned.

    results = run_ranks(worker, world_size=2, backend="gloo", args=(...,))

Each rank initializes the process group with a timeout (every collective
fails after COLLECTIVE_TIMEOUT_S rather than hanging), and the whole run is
bounded (4 x that by default), after which the ranks are killed and the
test fails. FP8KIT_DIST_TIMEOUT_S sets COLLECTIVE_TIMEOUT_S (default 60),
for runs that slow every kernel down (compute-sanitizer). A worker's
exception is re-raised in the test as RankError(rank, type name, message,
traceback), so a test can assert on what every rank raised. Workers are top-level functions of a test module
(spawn imports them by name): worker(rank, world_size, device, *args).
The ranks rendezvous through a FileStore in a fresh temporary directory,
not a TCP port, so that several test processes (pytest -n) can run ranks
at once.

backend "nccl" runs one rank per GPU (device cuda:<rank>) and is skipped
without torch.cuda.device_count() >= world_size; "gloo" runs on the CPU.

gemm_states(model) lists the scaling states the tests compare across ranks.
"""

from __future__ import annotations

import datetime
import os
import pickle
import queue
import shutil
import tempfile
import time
import traceback

import pytest
import torch
import torch.multiprocessing as mp
from torch.utils._pytree import tree_map_only

COLLECTIVE_TIMEOUT_S = float(os.environ.get("FP8KIT_DIST_TIMEOUT_S", "60"))


class RankError(Exception):
    def __init__(self, rank: int, kind: str, message: str, tb: str):
        super().__init__(f"rank {rank} raised {kind}: {message}\n{tb}")
        self.rank, self.kind, self.message = rank, kind, message


# pytest params of a test's backend: gloo on the CPU, nccl (marked gpu).
BACKENDS = [pytest.param("gloo", id="gloo"), pytest.param("nccl", id="nccl", marks=pytest.mark.gpu)]


def gemm_states(model: torch.nn.Module) -> list:
    """The scaling state (ext.LinearState) of every GEMM of the fp8kit
    layers under `model`, in module order, a fused layer's GEMMs in order
    (each GEMM's states in the order its recipes were first used)."""
    import fp8kit.torch as ft
    out = []
    for m in model.modules():
        if isinstance(m, ft.Linear):
            out += m.fp8_states
        elif isinstance(m, (ft.LayerNormLinear, ft.LayerNormMLP)):
            out += [st for states in m.fp8_states.values() for st in states]
    return out


def _rank_main(worker, rank, world_size, store_file, backend, args, results):
    torch.set_num_threads(1)
    import torch.distributed as dist
    device = torch.device("cpu")
    try:
        if backend == "nccl":
            device = torch.device("cuda", rank)
            torch.cuda.set_device(device)
        dist.init_process_group(backend, init_method=f"file://{store_file}",
                                rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
                                device_id=device if backend == "nccl" else None)
        # On the CPU: the test process need not touch this rank's device.
        out = tree_map_only(torch.Tensor, lambda t: t.detach().cpu(),
                            worker(rank, world_size, device, *args))
        # Pickled here, by value: a tensor sent through the queue as it is
        # would live in shared memory that dies with this process.
        results.put((rank, "ok", pickle.dumps(out)))
    except BaseException as e:  # noqa: BLE001  (reported to the test, which fails)
        results.put((rank, "error", (type(e).__name__, str(e), traceback.format_exc())))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(worker, world_size: int, backend: str = "gloo", args=(),
              timeout: float = 4 * COLLECTIVE_TIMEOUT_S):
    """[worker's result on rank 0, rank 1, ...]; raises the first rank's
    RankError when any rank raised (`errors` on it holds every rank's)."""
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        pytest.skip(f"NCCL needs {world_size} GPUs, found {torch.cuda.device_count()}")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    # The ranks meet through a FileStore in a directory of this run's own,
    # not a TCP port: a free port picked here could be taken by another
    # process (another pytest worker's ranks) before rank 0 listens on it.
    rendezvous = tempfile.mkdtemp(prefix="fp8kit-dist-")
    store_file = os.path.join(rendezvous, "store")
    procs = [ctx.Process(target=_rank_main,
                         args=(worker, r, world_size, store_file, backend, args, results))
             for r in range(world_size)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    got = {}
    try:
        while len(got) < world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"{worker.__name__} on {world_size} ranks did not finish within "
                            f"{timeout} s (finished ranks: {sorted(got)})")
            try:
                rank, status, value = results.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)
                        and r not in got]
                if dead:
                    pytest.fail(f"rank {dead[0]} died with exit code {procs[dead[0]].exitcode}")
                continue
            got[rank] = (status, value)
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
        shutil.rmtree(rendezvous, ignore_errors=True)
    errors = [RankError(r, *v) for r, (s, v) in sorted(got.items()) if s == "error"]
    if errors:
        errors[0].errors = errors
        raise errors[0]
    return [pickle.loads(got[r][1]) for r in range(world_size)]
