"""The models benchmark's TransformerEngine peer of the mixture-of-experts
decoder (fp8kit/models/moe_te.py, bench_peers.py), with a stand-in for
transformer_engine.pytorch where TE is not installed: its GroupedLinear
computes in bf16 and, as TE's FP8 grouped GEMM, refuses row counts that
are not multiples of 16; its dense layers are fp8kit's run outside
fp8kit's autocast (high precision), its autocast does nothing. So the
peer's plumbing runs here: the padding of each expert's tokens, the
weights, the routing, and the benchmark's te-* runs of an MoE config."""

import contextlib
import dataclasses
import types

import numpy as np
import pytest
import torch

import fp8kit.torch as ft
from fp8kit.bench import te_peer
from fp8kit.models import bench, llama_torch, moe_te
from fp8kit.models.config import CONFIGS
from fp8kit.models.init import init_params
from small_config import SMALL

MOE = dataclasses.replace(SMALL, experts=4, top_k=2, init_std=0.1)


class _GroupedLinear(torch.nn.Module):
    """te.GroupedLinear's signature, bf16 GEMMs; each call's m_splits recorded."""

    calls = []

    def __init__(self, num_gemms, in_features, out_features, bias=True, params_dtype=None,
                 device=None):
        super().__init__()
        for e in range(num_gemms):
            self.register_parameter(f"weight{e}", torch.nn.Parameter(torch.empty(
                out_features, in_features, dtype=params_dtype, device=device)))

    def forward(self, x, m_splits):
        _GroupedLinear.calls.append(list(m_splits))
        if not isinstance(m_splits, list) or any(m % 16 for m in m_splits):
            raise RuntimeError(f"ret.lda % 16 == 0. Caller must pad. {m_splits}")
        return torch.cat([part @ getattr(self, f"weight{e}").t().to(part.dtype)
                          for e, part in enumerate(x.split(m_splits))])


FAKE_TE = types.SimpleNamespace(
    Linear=ft.Linear, LayerNormLinear=ft.LayerNormLinear, LayerNormMLP=ft.LayerNormMLP,
    GroupedLinear=_GroupedLinear, autocast=lambda enabled, recipe: contextlib.nullcontext())


@pytest.fixture
def fake_te(monkeypatch):
    monkeypatch.setattr(te_peer, "torch_module", lambda: (FAKE_TE, None))
    monkeypatch.setattr(te_peer, "recipe", lambda name: f"TE {name}")
    _GroupedLinear.calls = []
    return FAKE_TE


def test_padded_rows_start_each_expert_at_a_multiple_of_16():
    counts = torch.tensor([3, 0, 17, 16, 1])
    expert = torch.repeat_interleave(torch.arange(5), counts)
    rows, padded = moe_te.padded_rows(expert, counts)
    assert padded.tolist() == [16, 0, 32, 16, 16]
    want = [*range(0, 3), *range(16, 33), *range(48, 64), 64]
    assert rows.tolist() == want


def test_the_te_block_routes_and_computes_as_fp8kits(fake_te):
    """Same weights, same input: the TE block's output, load-balancing loss
    and gradients are fp8kit's bf16 block's (the padding rows add nothing),
    every grouped call padded to multiples of 16."""
    params = init_params(MOE, seed=1)
    model = llama_torch.Llama(MOE)
    llama_torch.load_params(model, params)
    mlp = model.layers[0].mlp
    peer = moe_te.TEMoEMLP(fake_te, mlp)
    assert peer.router is mlp.router and peer.norm is mlp.norm
    x = torch.randn(2, 24, MOE.hidden, requires_grad=True)
    results = []
    for block in (mlp, peer):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y, aux = block(x)
        dx, drouter = torch.autograd.grad((y.float() ** 2).sum() + aux, [x, block.router.weight])
        results.append((y, aux, dx, drouter))
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    splits = _GroupedLinear.calls
    assert len(splits) == 2 and splits[0] == splits[1]
    assert sum(splits[0]) >= 2 * 24 * MOE.top_k and all(m % 16 == 0 for m in splits[0])
    for e in range(MOE.experts):
        torch.testing.assert_close(peer.w_down.get_parameter(f"weight{e}"),
                                   mlp.w_down.weight[e])


def test_convert_swaps_every_moe_block(fake_te):
    model = llama_torch.Llama(MOE)
    moe_te.convert(fake_te, model)
    assert all(type(layer.mlp) is moe_te.TEMoEMLP for layer in model.layers)
    names = {n for n, _ in model.named_parameters()}
    assert "layers.1.mlp.w_gate_up.weight3" in names and "layers.1.mlp.router.weight" in names
    assert not any(n.endswith("w_gate_up.weight") for n in names)


@pytest.mark.parametrize("recipe", bench.TE_RECIPES)
def test_the_te_runs_of_an_moe_config_train_through_te_grouped_linear(fake_te, recipe):
    cfg = dataclasses.replace(CONFIGS["moe_tiny"], layers=1, seq_len=32)
    made = []

    def spy(*args, **kwargs):
        made.append(bench_torch_trainer(*args, **kwargs))
        return made[-1]
    bench_torch_trainer = bench.torch_trainer
    with pytest.MonkeyPatch.context() as m:
        m.setattr(bench, "torch_trainer", spy)
        run = bench.measure("torch", cfg, recipe, "eager", batch=2, warmup=1, steps=2)
    assert "error" not in run, run
    assert np.isfinite(run["last_loss"]) and not run["diverged"]
    trainer = made[0][0]
    assert trainer.recipe == f"TE {recipe[3:]}"
    assert type(trainer.model.layers[0].mlp) is moe_te.TEMoEMLP
    assert len(trainer.aux_losses) == 2
    # Both grouped layers in each of the 3 steps, each call's counts padded
    # (128 pairs over 4 experts: some groups need zero rows).
    assert len(_GroupedLinear.calls) == 3 * 2
    assert all(m % 16 == 0 for split in _GroupedLinear.calls for m in split)
    assert any(sum(split) > 2 * 32 * cfg.top_k for split in _GroupedLinear.calls)


@pytest.mark.parametrize("recipe", bench.TE_RECIPES)
def test_without_te_the_moe_rows_say_why(monkeypatch, recipe):
    monkeypatch.setattr(te_peer, "torch_module",
                        lambda: (None, "TransformerEngine (PyTorch) not available (a test)"))
    cfg = dataclasses.replace(CONFIGS["moe_tiny"], layers=1, seq_len=32)
    run = bench.measure("torch", cfg, recipe, "eager", batch=2, warmup=1, steps=1)
    assert run["error"] == "TransformerEngine (PyTorch) not available (a test)"


def test_a_te_without_grouped_linear_is_named(monkeypatch):
    dense_only = types.SimpleNamespace(**{k: v for k, v in vars(FAKE_TE).items()
                                          if k != "GroupedLinear"})
    monkeypatch.setattr(te_peer, "torch_module", lambda: (dense_only, None))
    monkeypatch.setattr(te_peer, "recipe", lambda name: name)
    cfg = dataclasses.replace(CONFIGS["moe_tiny"], layers=1, seq_len=32)
    run = bench.measure("torch", cfg, "te-current", "eager", batch=2, warmup=1, steps=1)
    assert "has no GroupedLinear" in run["error"]


def test_jax_te_rows_are_dense_only():
    """TE-JAX runs dense configs under te-delayed and te-current; an MoE
    config's rows and te-block say why instead (te-block is not planned
    for JAX at all)."""
    moe = dataclasses.replace(CONFIGS["moe_tiny"], layers=1, seq_len=32)
    run = bench.measure("jax", moe, "te-current", "jit", batch=2, warmup=1, steps=1)
    assert "mixture-of-experts config are PyTorch's" in run["error"]
    dense = dataclasses.replace(CONFIGS["tiny"], layers=1, seq_len=32)
    run = bench.measure("jax", dense, "te-block", "jit", batch=2, warmup=1, steps=1)
    assert "runs in PyTorch only" in run["error"]
    args = bench._parser().parse_args(["--recipes", "bf16,te-block", "--frameworks",
                                       "torch,jax"])
    assert [(fw, r) for fw, r, _, _ in bench._plan(["torch", "jax"], ["bf16", "te-block"],
                                                   args)] == [
        ("torch", "bf16"), ("torch", "te-block"), ("jax", "bf16")]
