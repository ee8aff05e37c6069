"""FSDP2 (nested fully_shard, weights resharded after forward) around
fp8kit's layers whose caller adds a residual in place (`y = layer(x);
y += x`, as transformer blocks do), under every recipe, with and without
the FP8 all-gather, on 2 gloo ranks.

An output that is a view of the layer's GEMM output would lose FSDP2's
pre-backward hook to the in-place add (FSDP2 warns "returned a view
tensor"), and backward would run with the weights still sharded. No
layer's output is a view, FSDP2 warns nothing, each rank's output is the
unsharded model's on that rank's batch, and the gradients are the ranks'
average of the unsharded model's."""

import copy
import warnings

import pytest
import torch

import fp8kit.torch as ft
from distributed_harness import run_ranks
from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling
from fp8kit.torch.distributed import enable_fp8_all_gather

RECIPES = {"delayed": DelayedScaling(), "current": CurrentScaling(), "block": BlockScaling()}
HIDDEN = 32
CASES = [("delayed", True), ("current", True), ("delayed", False), ("block", False)]


class Residual(torch.nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        y = self.layer(x)
        y += x
        return y


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(Residual(ft.Linear(HIDDEN, HIDDEN)),
                               Residual(ft.LayerNormLinear(HIDDEN, HIDDEN)),
                               Residual(ft.LayerNormMLP(HIDDEN, 2 * HIDDEN)))


def _batch(rank):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(2, 8, HIDDEN, generator=g) * (rank + 1)


def _train_step(model, x, recipe):
    with ft.autocast(recipe=recipe):
        y = model(x)
    y.pow(2).mean().backward()
    return y.detach()


def _case(rank, world_size, recipe_name, fp8):
    from torch.distributed.fsdp import fully_shard
    recipe = RECIPES[recipe_name]
    model = _model()
    reference = copy.deepcopy(model)
    if fp8:
        enable_fp8_all_gather(model)
    for block in model:
        fully_shard(block.layer)  # the layer's output is what FSDP2 hooks
    fully_shard(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = _train_step(model, _batch(rank), recipe)
    out = {"y": y, "grads": [p.grad.full_tensor() for p in model.parameters()],
           "warnings": [str(w.message) for w in caught if "view" in str(w.message)]}
    # The unsharded model on every rank's batch, a fresh copy per rank (each
    # rank's fresh scaling state seeds from its own tensors).
    grads = None
    for r in range(world_size):
        layer = copy.deepcopy(reference)
        ref_y = _train_step(layer, _batch(r), recipe)
        if r == rank:
            out["ref_y"] = ref_y
        g = [p.grad / world_size for p in layer.parameters()]
        grads = g if grads is None else [a + b for a, b in zip(grads, g)]
    out["ref_grads"] = grads
    return out


def _worker(rank, world_size, device, cases):
    return [_case(rank, world_size, *case) for case in cases]


def test_in_place_residual_under_nested_fully_shard():
    results = run_ranks(_worker, 2, "gloo", args=(CASES,))
    for i, case in enumerate(CASES):
        for rank in results:
            got = rank[i]
            assert got["warnings"] == [], case
            assert torch.equal(got["y"], got["ref_y"]), case
            for g, ref in zip(got["grads"], got["ref_grads"]):
                torch.testing.assert_close(g, ref, rtol=1e-5, atol=1e-7,
                                           msg=lambda m: f"{case}: {m}")


@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("kind", ["Linear", "LayerNormLinear", "LayerNormMLP"])
def test_no_output_is_a_view(kind, recipe):
    """What FSDP2 needs of a module's output, checked without ranks; an
    in-place residual then reaches the layer's parameters."""
    layer = _model()[["Linear", "LayerNormLinear", "LayerNormMLP"].index(kind)].layer
    x = torch.randn(2, 8, HIDDEN, requires_grad=True)
    with ft.autocast(recipe=RECIPES[recipe]):
        y = layer(x)
    assert y._base is None and not y._is_view()
    y += x
    y.sum().backward()
    assert all(p.grad is not None for p in layer.parameters())
