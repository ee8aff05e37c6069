"""Distributed setups fp8kit refuses, on 2 ranks (gloo on the CPU; nccl on
GPUs, marked gpu): each must raise a clear error on the ranks concerned,
never hang (every collective runs under the harness's timeout, so a hang
fails as a timeout rather than with the expected message)."""

import pytest
import torch
import torch.distributed as dist

import fp8kit.torch as ft
from distributed_harness import BACKENDS, run_ranks
from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling
from fp8kit.torch.distributed import AmaxSync, enable_fp8_all_gather


def _train_step(model, recipe, device):
    with ft.autocast(recipe=recipe):
        model(torch.randn(4, 16, device=device, requires_grad=True)).sum().backward()


def _raised(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001  (what it raised is the result)
        return type(e).__name__, str(e)
    return None


def _model(device, fused: bool):
    layers = [ft.LayerNormLinear(16, 16), ft.LayerNormMLP(16, 16)] if fused else [ft.Linear(16, 16)]
    return torch.nn.Sequential(*layers).to(device)


def _sharded(device, fused=False):
    from torch.distributed.fsdp import fully_shard
    model = enable_fp8_all_gather(_model(device, fused))
    fully_shard(model)
    return model


def _bad_setups_worker(rank, world_size, device):
    out = {}

    def different_recipes():
        layer = ft.Linear(16, 16).to(device)
        _train_step(layer, DelayedScaling(margin=rank), device)
        AmaxSync(layer).sync()
    out["recipes"] = _raised(different_recipes)

    def different_kinds():  # only rank 1 has a delayed-scaling state
        layer = ft.Linear(16, 16).to(device)
        _train_step(layer, CurrentScaling() if rank == 0 else DelayedScaling(), device)
        AmaxSync(layer).sync()
    out["kinds"] = _raised(different_kinds)

    def different_models():
        model = torch.nn.Sequential(*[ft.Linear(16, 16) for _ in range(rank + 1)]).to(device)
        _train_step(model, DelayedScaling(), device)
        AmaxSync(model).sync()
    out["models"] = _raised(different_models)

    only_rank_0 = dist.new_group([0])  # every rank takes part in making it
    out["group"] = _raised(lambda: AmaxSync(ft.Linear(16, 16), group=only_rank_0))
    out["group_type"] = _raised(lambda: AmaxSync(ft.Linear(16, 16), group="world"))
    out["after_fully_shard"] = [
        _raised(lambda: enable_fp8_all_gather(_sharded_plain(device, fused)))
        for fused in (False, True)]

    def fsdp_different_recipes():
        recipe = CurrentScaling() if rank == 0 else DelayedScaling()
        _train_step(_sharded(device), recipe, device)
    out["fsdp_recipes"] = _raised(fsdp_different_recipes)

    def fsdp_block_scaling(fused):  # every rank refuses before the all-gather
        _train_step(_sharded(device, fused), BlockScaling(), device)
    out["fsdp_block_scaling"] = [_raised(lambda: fsdp_block_scaling(fused))
                                 for fused in (False, True)]
    return out


def _sharded_plain(device, fused: bool):
    from torch.distributed.fsdp import fully_shard
    model = _model(device, fused)
    fully_shard(model)
    return model


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_setups_raise_on_every_rank(backend):
    ranks = run_ranks(_bad_setups_worker, 2, backend)
    for r in ranks:
        for key in ("recipes", "kinds", "models"):
            kind, message = r[key]
            assert kind == "RuntimeError", r[key]
            assert "ranks of the group run different fp8kit layers or recipes" in message
        assert r["group_type"][0] == "TypeError" and "ProcessGroup" in r["group_type"][1]
        for kind, message in r["after_fully_shard"]:  # Linear, then the fused layers
            assert kind == "RuntimeError" and "already sharded by fully_shard" in message
        kind, message = r["fsdp_recipes"]
        assert kind == "RuntimeError" and "run different fp8kit recipes" in message
        for kind, message in r["fsdp_block_scaling"]:  # Linear, then the fused layers
            assert kind == "TypeError" and "all-gathered in per-tensor FP8, but BlockScaling" \
                in message
    assert ranks[0]["group"] is None
    kind, message = ranks[1]["group"]
    assert kind == "ValueError" and "this rank (1) is not in the group" in message


def test_single_process_needs_no_group():
    layer = ft.Linear(16, 16)
    _train_step(layer, DelayedScaling(), "cpu")
    before = layer.fp8_state.scale
    AmaxSync(layer).sync()  # no process group: nothing to reduce
    assert torch.equal(layer.fp8_state.scale, before)
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        AmaxSync(layer, group=object())
