"""AmaxSync and DistributedDataParallel on 2 and 4 ranks (gloo on the CPU;
nccl on GPUs, marked gpu): the amax histories of every GEMM (of Linear and
of the fused LayerNormLinear and LayerNormMLP) reduced across ranks, scales
from the core's rule and bit-identical on every rank, DDP gradients as the
single-process run's on the concatenated batch."""

import copy

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import fp8kit.torch as ft
from distributed_harness import BACKENDS, gemm_states, run_ranks
from fp8kit.recipe import CurrentScaling, DelayedScaling, Format
from fp8kit.torch.distributed import AmaxSync

FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
TOKENS = 8  # per rank


def _model(device):
    torch.manual_seed(0)  # the same weights on every rank
    return torch.nn.Sequential(ft.Linear(32, 64), torch.nn.GELU(), ft.Linear(64, 32)).to(device)


def _batch(step: int, world_size: int, device):
    """The global batch of `step`; rank r's rows are scaled by r + 1, so the
    last rank holds the largest |x| and no other rank's amax is the batch's."""
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(world_size, TOKENS, 32, generator=g)
    x = x * torch.arange(1, world_size + 1, dtype=torch.float32).view(-1, 1, 1)
    return x.reshape(-1, 32).to(device)


def _states(model):
    return [(st.amax_history, st.scale, st.scale_inv) for st in gemm_states(model)]


def _ddp_worker(rank, world_size, device, delayed: bool, steps: int):
    recipe = DelayedScaling(fp8_format=Format.HYBRID) if delayed else CurrentScaling()
    model = _model(device)
    reference = copy.deepcopy(model)  # one process, the concatenated batch
    ddp = DDP(model)
    sync = AmaxSync(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    out = []
    for step in range(steps):
        x_all = _batch(step, world_size, device)
        x = x_all[rank * TOKENS:(rank + 1) * TOKENS]
        with ft.autocast(recipe=recipe):
            loss = ddp(x).pow(2).mean()
        loss.backward()
        pending = sync.start()
        with ft.autocast(recipe=recipe):
            ref_loss = reference(x_all).pow(2).mean()
        ref_loss.backward()
        pending.wait()
        out.append({"grads": [p.grad.clone() for p in model.parameters()],
                     "ref_grads": [p.grad.clone() for p in reference.parameters()],
                     "states": _states(model), "x_amax": x_all.abs().max()})
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
    return out


def _rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


STEPS = 3


def _two_ranks_worker(rank, world_size, device):
    # Every 2-rank case in one spawn: starting processes is most of the cost.
    return {"delayed": _ddp_worker(rank, world_size, device, True, STEPS),
            "current": _ddp_worker(rank, world_size, device, False, 2),
            "rule": _sync_rule_worker(rank, world_size, device)}


@pytest.fixture(scope="module", params=BACKENDS)
def two_ranks(request):
    return run_ranks(_two_ranks_worker, 2, request.param)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ddp_delayed_scaling_on_four_ranks(backend):
    _check_ddp_delayed(run_ranks(_ddp_worker, 4, backend, args=(True, STEPS)))


def test_ddp_delayed_scaling_on_two_ranks(two_ranks):
    _check_ddp_delayed([r["delayed"] for r in two_ranks])


def _check_ddp_delayed(ranks):
    steps = STEPS
    for step in range(steps):
        per_rank = [r[step] for r in ranks]
        # The same state on every rank, bit for bit.
        for other in per_rank[1:]:
            for a, b in zip(per_rank[0]["states"], other["states"]):
                for ta, tb in zip(a, b):
                    assert torch.equal(ta, tb)
        history, scale, scale_inv = per_rank[0]["states"][0]
        # The first layer's input amax is the whole batch's (the last rank's
        # rows), which no other rank saw.
        assert history[0, 0].item() == per_rank[0]["x_amax"].item()
        # Every recorded scale is the rule's for its history (margin 0, max).
        for h, s, si in per_rank[0]["states"]:
            for slot, fmt in enumerate(("e4m3", "e4m3", "e5m2")):
                amax = np.float32(h[slot].max().item())
                assert s[slot].item() == np.float32(FP8_MAX[fmt]) / amax
                assert si[slot].item() == np.float32(1) / np.float32(s[slot].item())
        # DDP's averaged gradients are the one-process gradients of the
        # concatenated batch within FP8 rounding: the input casts differ
        # (each rank's own scale at step 0, a shared one later) by up to
        # E4M3's half-ulp, 2**-4 relative, in every element; a wrong batch or
        # a missing average would be off by O(1).
        for rank in per_rank:
            for g, ref in zip(rank["grads"], rank["ref_grads"]):
                assert _rel(g, ref) < 0.1
        for g in zip(*[r["grads"] for r in per_rank]):
            assert all(torch.equal(g[0], gi) for gi in g[1:])


def test_ddp_current_scaling_matches_one_process(two_ranks):
    ranks = [r["current"] for r in two_ranks]
    for step in range(2):
        for rank in (r[step] for r in ranks):
            for g, ref in zip(rank["grads"], rank["ref_grads"]):
                assert _rel(g, ref) < 0.1
            # Current scaling keeps no history: AmaxSync leaves its states alone.
            for h, s, si in rank["states"]:
                assert not h.any() and torch.equal(s, torch.ones(3)) and torch.equal(si, s)


def _sync_rule_worker(rank, world_size, device):
    """Histories recorded from different data on each rank, then synced:
    returns the local histories (all-gathered) and the synced state, of
    every GEMM (one Linear's, a LayerNormLinear's, a LayerNormMLP's two)
    stacked."""
    recipe = DelayedScaling(amax_history_len=4, margin=1, fp8_format=Format.E4M3)
    torch.manual_seed(0)
    model = torch.nn.Sequential(ft.Linear(16, 16), ft.LayerNormLinear(16, 32),
                                ft.LayerNormMLP(32, 16, activation="swiglu")).to(device)
    sync = AmaxSync(model)
    out = []
    for step, poison in enumerate((False, True, False)):
        g = torch.Generator().manual_seed(10 * step + rank)
        x = (torch.randn(4, 16, generator=g) * (rank + 1 + step)).to(device)
        if poison and rank == 1:
            x[0, 0] = float("nan")  # the reduced amax is non-finite
        with ft.autocast(recipe=recipe):
            model(x.requires_grad_()).sum().backward()
        states = gemm_states(model)
        local = torch.stack([st.amax_history for st in states]).to(device)
        gathered = [torch.empty_like(local) for _ in range(world_size)]
        dist.all_gather(gathered, local)
        sync.sync()
        out.append({"local": [g.cpu() for g in gathered],
                    **{key: torch.stack([getattr(st, name) for st in states]) for key, name in
                       (("history", "amax_history"), ("scale", "scale"),
                        ("scale_inv", "scale_inv"))}})
    return out


def test_amax_sync_rule(two_ranks):
    ranks = [r["rule"] for r in two_ranks]
    previous_scale = torch.ones(4, 3)  # [GEMM, slot]
    for step in range(3):
        r0, r1 = ranks[0][step], ranks[1][step]
        for key in ("history", "scale", "scale_inv"):
            assert torch.equal(r0[key], r1[key])
        # The reduced history: the elementwise max of the ranks' (NaN as inf).
        expected = torch.stack(r0["local"]).nan_to_num(nan=float("inf"), posinf=float("inf"))
        assert torch.equal(r0["history"], expected.max(0).values)
        for gemm, slot in np.ndindex(4, 3):
            amax = r0["history"][gemm, slot].max().item()
            if np.isfinite(amax) and amax > 0:
                want = np.float32(np.float32(448.0) / np.float32(amax)) * np.float32(0.5)
            else:  # no new scale: the previous sync's
                want = previous_scale[gemm, slot].item()
            assert r0["scale"][gemm, slot].item() == want, (step, gemm, slot)
        previous_scale = r0["scale"]
    # The poisoned step kept every scale: the NaN reached the history of every
    # input and output gradient but the last GEMM's (the loss's ones, amax 1
    # as before), and the weights did not change.
    assert torch.equal(ranks[0][1]["scale"], ranks[0][0]["scale"])
