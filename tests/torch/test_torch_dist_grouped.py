"""fp8kit.torch.GroupedLinear under FSDP2 (fully_shard: its [E, out, in]
weight split by experts over the ranks, all-gathered in high precision,
as it keeps no FP8 weight copy) and Distributed Checkpoint (saved by two
ranks, loaded in one process), on 2 ranks (gloo on the CPU; nccl on GPUs,
marked gpu).

Each rank's output must be bit-identical to the unsharded layer's on that
rank's batch, and the gradients the ranks' average."""

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict

import fp8kit.torch as ft
from distributed_harness import BACKENDS, run_ranks
from fp8kit.recipe import CurrentScaling

RECIPE = CurrentScaling()
EXPERTS, K, N = 4, 32, 48


class _Experts(torch.nn.Module):
    """Two grouped layers with a GELU between: an expert MLP."""

    def __init__(self):
        super().__init__()
        self.up = ft.GroupedLinear(EXPERTS, K, N)
        self.down = ft.GroupedLinear(EXPERTS, N, K)

    def forward(self, x, counts):
        return self.down(torch.nn.functional.gelu(self.up(x, counts)), counts)


def _model(device):
    torch.manual_seed(0)
    return _Experts().to(device)


def _run(model, x, counts):
    with ft.autocast(recipe=RECIPE):
        return model(x, counts)


def _batch(rank: int, device):
    g = torch.Generator().manual_seed(10 + rank)
    counts = [5 + 3 * rank, 0, 11, 7 - rank]  # each rank its own, one expert empty
    x = torch.randn(sum(counts), K, generator=g) * (rank + 1)
    return x.to(device), counts


def _worker(rank, world_size, device, folder):
    from torch.distributed.fsdp import fully_shard
    ref = _model(device)
    model = _model(device)
    fully_shard(model.up)
    fully_shard(model.down)
    fully_shard(model)
    x, counts = _batch(rank, device)
    y = _run(model, x, counts)
    y.pow(2).mean().backward()
    ref_y = _run(ref, x, counts)
    ref_y.pow(2).mean().backward()
    ref_grads = []
    for p in ref.parameters():  # the ranks' average, as FSDP2 reduces them
        g = p.grad.clone()
        dist.all_reduce(g)
        ref_grads.append(g / world_size)
    grads = [p.grad.full_tensor() for p in model.parameters()]
    dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=folder)
    weights = [p.full_tensor() for p in model.parameters()]
    return {"y": y.detach(), "ref_y": ref_y.detach(), "grads": grads, "ref_grads": ref_grads,
            "weights": weights, "shard": model.up.weight.to_local().shape[0]}


@pytest.mark.parametrize("backend", BACKENDS)
def test_fsdp2_shards_experts_and_checkpoints_them(backend, tmp_path):
    results = run_ranks(_worker, 2, backend, args=(str(tmp_path / "ckpt"),))
    for rank in results:
        assert rank["shard"] == EXPERTS // 2   # two experts per rank
        assert torch.equal(rank["y"], rank["ref_y"])
        for g, ref in zip(rank["grads"], rank["ref_grads"]):
            torch.testing.assert_close(g, ref, rtol=1e-5, atol=1e-7)
    # Saved by two ranks, loaded into one unsharded process: every weight.
    model = _model("cpu")
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=str(tmp_path / "ckpt"))
    model.load_state_dict(state["model"])
    for got, want in zip(model.parameters(), results[0]["weights"]):
        assert torch.equal(got.detach(), want)
