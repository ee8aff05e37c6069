"""A small MLP trained in FP8 (fp8kit.torch.Linear under autocast) tracks
its bf16 twin (torch.nn.Linear under torch.autocast) step by step."""

import contextlib

import pytest
import torch

import fp8kit.torch as ft
from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling, Format

STEPS = 300


def mlp(linear):
    return torch.nn.Sequential(linear(32, 64), torch.nn.GELU(), linear(64, 64), torch.nn.GELU(),
                               linear(64, 16))


@contextlib.contextmanager
def _both(outer, inner):
    with outer, inner:
        yield


def train(model, batches, context):
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for x, y in batches:
        opt.zero_grad()
        with context():
            out = model(x.to(torch.bfloat16))
        loss = torch.nn.functional.mse_loss(out.float(), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return torch.tensor(losses)


@pytest.mark.parametrize("recipe", [DelayedScaling(fp8_format=Format.HYBRID),
                                    CurrentScaling(fp8_format=Format.HYBRID), BlockScaling()])
def test_fp8_mlp_tracks_bf16_twin(recipe):
    torch.manual_seed(0)
    teacher = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                                  torch.nn.Linear(64, 16))
    data_x = torch.randn(4096, 32)
    data_y = teacher(data_x).detach() * 2
    g = torch.Generator().manual_seed(1)
    batches = [(data_x[i], data_y[i]) for i in
               (torch.randint(0, 4096, (64,), generator=g) for _ in range(STEPS))]

    torch.manual_seed(2)
    twin = mlp(torch.nn.Linear)
    model = mlp(ft.Linear)
    model.load_state_dict(twin.state_dict(), strict=True)  # identical start

    ref = train(twin, batches, lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    # Float32 weights and bfloat16 inputs: under torch.autocast, as the twin
    # (fp8kit.torch.Linear, as torch.nn.Linear, refuses mixed dtypes outside it).
    got = train(model, batches, lambda: _both(torch.autocast("cpu", dtype=torch.bfloat16),
                                              ft.autocast(recipe=recipe)))

    assert ref[-20:].mean() < 0.2 * ref[:5].mean()  # the task is learnable
    # Same trajectory within FP8 noise: windowed means stay within 15%.
    for w_ref, w_got in zip(ref.split(30), got.split(30)):
        assert abs(w_got.mean() - w_ref.mean()) <= 0.15 * w_ref.mean() + 1e-3
    assert got[-20:].mean() < 1.15 * ref[-20:].mean() + 1e-3
