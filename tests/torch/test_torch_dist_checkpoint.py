"""Distributed Checkpoint (torch.distributed.checkpoint) of fp8kit layers
(Linear and the fused LayerNormLinear and LayerNormMLP) sharded by FSDP2
with FP8 all-gather: exact resume on the same world size,
resharding 2 -> 1 and 1 -> 2 ranks with the scaling state, and plain values
loaded with weights_only=True (gloo on the CPU; nccl on GPUs, marked gpu)."""

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                     get_optimizer_state_dict,
                                                     set_model_state_dict,
                                                     set_optimizer_state_dict)

import fp8kit.torch as ft
from distributed_harness import BACKENDS, gemm_states, run_ranks
from fp8kit.recipe import DelayedScaling
from fp8kit.torch.distributed import AmaxSync, FP8LoadPlanner, enable_fp8_all_gather

RECIPE = DelayedScaling()
FP8_LAYERS = (ft.Linear, ft.LayerNormLinear, ft.LayerNormMLP)


def _model(seed: int, device="cpu"):
    torch.manual_seed(seed)
    return torch.nn.Sequential(ft.Linear(32, 64), torch.nn.GELU(), ft.LayerNormLinear(64, 32),
                               ft.LayerNormMLP(32, 48, normalization="RMSNorm")).to(device)


def _sharded(seed: int, device):
    from torch.distributed.fsdp import fully_shard
    model = enable_fp8_all_gather(_model(seed, device))
    for m in model:
        if isinstance(m, FP8_LAYERS):
            fully_shard(m)
    fully_shard(model)
    return model


def _batch(step: int, rank: int, device="cpu"):
    g = torch.Generator().manual_seed(100 * step + rank)
    return (torch.randn(8, 32, generator=g) * (rank + 1)).to(device)


def _states(model):
    return [(st.amax_history, st.scale, st.scale_inv, st.seeded) for st in gemm_states(model)]


def _full_weights(model):
    return [p.full_tensor() if hasattr(p, "full_tensor") else p.detach().clone()
            for p in model.parameters()]


class _Trainer:
    def __init__(self, model, sync=None):
        self.model, self.sync = model, sync
        self.opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def step(self, step: int, rank: int, device):
        with ft.autocast(recipe=RECIPE):
            y = self.model(_batch(step, rank, device))
        y.pow(2).mean().backward()
        if self.sync is not None:
            self.sync.sync()
        self.opt.step()
        self.opt.zero_grad()
        return y.detach()

    def state_dict(self):
        return {"model": get_model_state_dict(self.model),
                "optim": get_optimizer_state_dict(self.model, self.opt)}

    def load(self, path):
        state = self.state_dict()
        dcp.load(state, checkpoint_id=path, planner=FP8LoadPlanner())
        set_model_state_dict(self.model, state["model"])
        set_optimizer_state_dict(self.model, self.opt, state["optim"])


def _resume_worker(rank, world_size, device, path):
    run = _Trainer(_sharded(0, device))
    run.sync = AmaxSync(run.model)
    for step in range(2):
        run.step(step, rank, device)
    saved = {"weights": _full_weights(run.model), "states": _states(run.model)}
    dcp.save(run.state_dict(), checkpoint_id=path)
    going_on = [run.step(step, rank, device) for step in (2, 3)]
    # A fresh model (other weights, no scaling state yet) resumes from it.
    resumed = _Trainer(_sharded(1, device))
    resumed.sync = AmaxSync(resumed.model)
    resumed.load(path)
    loaded = _states(resumed.model)
    again = [resumed.step(step, rank, device) for step in (2, 3)]
    return {"saved": saved, "loaded": loaded, "going_on": going_on, "again": again,
            "end": (_full_weights(run.model), _states(run.model)),
            "end_resumed": (_full_weights(resumed.model), _states(resumed.model))}


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


def _load_worker(rank, world_size, device, path):
    run = _Trainer(_sharded(1, device))
    run.load(path)
    loaded = (_full_weights(run.model), _states(run.model))
    # The same checkpoint in an unsharded model on this rank's device.
    reference = _Trainer(_model(2, device))
    reference.load(path)
    with torch.no_grad(), ft.autocast(recipe=RECIPE):
        y_reference = reference.model(_batch(5, rank, device))
    return {"loaded": loaded, "y": run.step(5, rank, device), "y_reference": y_reference}


def _two_ranks_worker(rank, world_size, device, two_ranks_path, one_rank_path):
    # Both cases in one spawn: starting processes is most of the cost.
    return {"resume": _resume_worker(rank, world_size, device, two_ranks_path),
            "load": _load_worker(rank, world_size, device, one_rank_path)}


@pytest.fixture(scope="module", params=BACKENDS)
def checkpoints(request, tmp_path_factory):
    """A checkpoint of one process, then on 2 ranks: a checkpoint of theirs
    with its resume, and the one-process checkpoint loaded."""
    root = tmp_path_factory.mktemp("dcp")
    one_rank_path, two_ranks_path = str(root / "one_rank"), str(root / "two_ranks")
    single = _Trainer(_model(0))
    single.step(0, 0, "cpu")
    dcp.save(single.state_dict(), checkpoint_id=one_rank_path)
    ranks = run_ranks(_two_ranks_worker, 2, request.param, args=(two_ranks_path, one_rank_path))
    return {"single_saved": (_full_weights(single.model), _states(single.model)),
            "two_ranks_path": two_ranks_path, "ranks": ranks}


def test_resume_on_the_same_ranks_is_exact(checkpoints):
    for r in (r["resume"] for r in checkpoints["ranks"]):
        assert _equal(r["loaded"], r["saved"]["states"])
        assert _equal(r["again"], r["going_on"])  # bit-identical continuation
        assert _equal(r["end_resumed"], r["end"])


def test_two_rank_checkpoint_loads_in_one_process(checkpoints):
    # One process (no process group) loads the sharded checkpoint into a
    # model that has not run, and trains on.
    single = _Trainer(_model(2))
    single.load(checkpoints["two_ranks_path"])
    saved = checkpoints["ranks"][0]["resume"]["saved"]
    assert _equal(_full_weights(single.model), saved["weights"])
    assert _equal(_states(single.model), saved["states"])
    before = _states(single.model)
    y = single.step(2, 0, "cpu")
    assert torch.isfinite(y).all() and not _equal(_states(single.model), before)


def test_one_rank_checkpoint_loads_on_two(checkpoints):
    for r in (r["load"] for r in checkpoints["ranks"]):
        assert _equal(r["loaded"], checkpoints["single_saved"])
        # The loaded scales cast as one process casts: each rank's output is
        # the unsharded model's on that rank's batch, bit for bit.
        assert torch.equal(r["y"], r["y_reference"])


class _NotPlainData:
    pass


def test_load_planner_refuses_pickled_objects(tmp_path):
    path = str(tmp_path / "pickled")
    layer = ft.Linear(16, 16)
    state = {"layer": layer.state_dict(), "extra": {"thing": _NotPlainData()}}
    dcp.save(state, checkpoint_id=path)
    # DCP reports the planner's error as a CheckpointException naming the rank.
    with pytest.raises(CheckpointException, match=r"'extra.thing' is not plain data"):
        dcp.load({"layer": layer.state_dict(), "extra": {"thing": None}}, checkpoint_id=path,
                 planner=FP8LoadPlanner())
