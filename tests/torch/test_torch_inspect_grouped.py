"""fp8kit.torch.inspect on GroupedLinear: the layer's row of each cast
equals the merge of one fp8kit.torch.Linear per expert, run on that
expert's tokens and inspected the same way (amax the largest, counts and
element numbers added, sums added up to float32 rounding), under delayed,
current and block scaling, with an expert given no tokens and counts that
are not multiples of 16; it reports no scale (each expert has its own);
and training with inspection on is bit-identical to training without it.
On CUDA too (pytest -m gpu), with the counts on the GPU."""

import pytest
import torch

import fp8kit.torch as ft
from fp8kit.inspect import read_run
from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling, Format
from fp8kit.torch._cast_records import _merge
from torch_reference import DEVICES, device_of

RECIPES = {"delayed": DelayedScaling(fp8_format=Format.HYBRID),
           "current": CurrentScaling(fp8_format=Format.HYBRID),
           "block": BlockScaling()}
COUNTS = [5, 0, 27, 16]
K, N = 256, 32  # 256: two 1x128 tiles per row


def device_for(name: str, recipe: str) -> torch.device:
    device = device_of(name)
    if recipe == "block" and not ft.supports_block_scaled_fp8_gemm(device):
        pytest.skip(f"{device} runs no block-scaled FP8 GEMM")
    return device


class Experts(torch.nn.Module):
    """The experts as one GroupedLinear, or as one Linear per expert."""

    def __init__(self, grouped: bool, device):
        super().__init__()
        torch.manual_seed(5)
        source = ft.GroupedLinear(len(COUNTS), K, N, device=device)
        self.grouped = source if grouped else None
        if not grouped:
            self.experts = torch.nn.ModuleList(ft.Linear(K, N, device=device)
                                               for _ in COUNTS)
            with torch.no_grad():
                for e, lin in enumerate(self.experts):
                    lin.weight.copy_(source.weight[e])
                    lin.bias.copy_(source.bias[e])

    def forward(self, x, counts):
        if self.grouped is not None:
            return self.grouped(x, counts)
        return torch.cat([lin(part) for lin, part in zip(self.experts, x.split(COUNTS))])


def _inputs(device):
    g = torch.Generator().manual_seed(6)
    x = torch.randn(sum(COUNTS), K, generator=g)
    x[3, :7] *= 1e-6   # values that flush to zero
    x[30, 0] = 1e4     # one that makes the rest of its expert's small
    dy = torch.randn(sum(COUNTS), N, generator=g)
    return x.to(device), dy.to(device)


def _inspected_step(grouped: bool, recipe, device, log):
    """(TensorStats of one inspected step by name, y, the input gradient)."""
    model = Experts(grouped, device)
    x, dy = _inputs(device)
    x.requires_grad_(True)
    counts = torch.tensor(COUNTS, device=device)
    with ft.inspect(model, every=1, log=log) as handle:
        with ft.autocast(recipe=recipe):
            y = model(x, counts)
        y.backward(dy)
    stats = {t.name: t for t in handle.last}
    if not grouped and type(recipe) is BlockScaling:
        # A block-scaled Linear given no tokens casts nothing, while the
        # grouped layer casts every expert's weight: that of an expert with
        # no tokens is its Linear's weight cast on tokens of its own.
        for e, lin in enumerate(model.experts):
            if COUNTS[e] == 0:
                with ft.inspect(lin, every=1, log=log.with_suffix(".empty")) as alone:
                    with ft.autocast(recipe=recipe):
                        lin(torch.ones(16, K, device=device))
                stats[f"experts.{e}/weight"] = {t.role: t for t in alone.last}["weight"]
    return stats, y, x.grad


@pytest.mark.parametrize("recipe", ["delayed", "current", "block"])
@pytest.mark.parametrize("device", DEVICES)
def test_grouped_rows_equal_the_merged_linears_per_expert(recipe, device, tmp_path):
    device = device_for(device, recipe)
    got, y, dx = _inspected_step(True, RECIPES[recipe], device, tmp_path / "g.jsonl")
    per_expert, y_ref, dx_ref = _inspected_step(False, RECIPES[recipe], device,
                                                tmp_path / "l.jsonl")
    # The same casts: the layer's outputs are the per-expert Linears' (the
    # bias apart under block scaling, added after the GEMM there).
    if recipe != "block":
        assert torch.equal(y, y_ref) and torch.equal(dx, dx_ref)
    assert set(got) == {"grouped/input", "grouped/weight", "grouped/grad_output"}
    for role in ("input", "weight", "grad_output"):
        parts = [t for name, t in per_expert.items() if name.endswith("/" + role)]
        want = parts[0]
        for t in parts[1:]:
            want = _merge(want, t)
        have = got["grouped/" + role]
        assert have.scale is None  # a scale per expert: no one scale
        assert (have.amax, have.numel, have.underflow, have.saturated) == \
            (want.amax, want.numel, want.underflow, want.saturated), role
        for f in ("error_sq", "norm_sq"):
            assert getattr(have, f) == pytest.approx(getattr(want, f), rel=1e-5), (role, f)
    assert got["grouped/input"].underflow > 0
    assert got["grouped/grad_output"].numel == sum(COUNTS) * N


def _train(recipe, device, log=None):
    """Three SGD steps of a GroupedLinear; inspected every 2nd with `log`."""
    torch.manual_seed(7)
    layer = ft.GroupedLinear(len(COUNTS), K, N, device=device)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(8)
    handle = ft.inspect(layer, every=2, log=log) if log is not None else None
    outs = []
    for _ in range(3):
        x = torch.randn(sum(COUNTS), K, generator=g).to(device)
        with ft.autocast(recipe=recipe):
            loss = layer(x, COUNTS).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        outs.append(loss.detach())
    if handle is not None:
        handle.close()
        assert [r["step"] for r in read_run(log)] == [0, 2]
        assert [t.name for t in handle.last] == [
            "GroupedLinear/input", "GroupedLinear/weight", "GroupedLinear/grad_output"]
    state = [t for t in (layer.fp8_amax_history, layer.fp8_scale) if t is not None]
    return outs + list(layer.parameters()) + state


@pytest.mark.parametrize("recipe", ["delayed", "current", "block"])
@pytest.mark.parametrize("device", DEVICES)
def test_training_is_bit_identical_with_inspection_on(recipe, device, tmp_path):
    device = device_for(device, recipe)
    off = _train(RECIPES[recipe], device)
    on = _train(RECIPES[recipe], device, tmp_path / "stats.jsonl")
    assert len(off) == len(on) == (7 if recipe == "delayed" else 5)
    for a, b in zip(off, on):
        assert torch.equal(a, b)


def test_moe_decoder_trainer_logs_its_experts_and_is_bit_identical(tmp_path):
    from fp8kit.inspect import StatsLog
    from fp8kit.models.config import LlamaConfig
    from fp8kit.models.schedule import TrainConfig
    from fp8kit.models.train_torch import TorchTrainer
    cfg = LlamaConfig(hidden=64, layers=2, heads=4, kv_heads=2, ffn=64, seq_len=32, experts=4,
                      top_k=2)
    tcfg = TrainConfig(steps=3, batch=2, lr=3e-3, warmup_steps=1)
    log = tmp_path / "moe.jsonl"
    plain = TorchTrainer(cfg, tcfg, CurrentScaling(), device="cpu")
    with StatsLog(log, every=2) as stats:
        inspected = TorchTrainer(cfg, tcfg, CurrentScaling(), device="cpu", statistics=stats)
        assert plain.train_steps(3) == inspected.train_steps(3)
    for a, b in zip(plain.model.parameters(), inspected.model.parameters()):
        assert torch.equal(a, b)
    records = read_run(log)
    assert [r["step"] for r in records] == [0, 2]
    names = {f"layers.{i}.{g}/{r}" for i in range(2)
             for g in ("qkv", "wo", "experts.gate_up", "experts.down")
             for r in ("input", "weight", "grad_output")}
    assert set(records[0]["tensors"]) == names
    assert records[0]["tensors"]["layers.0.experts.down/weight"]["scale"] is None


def test_per_row_statistics_refuse_bad_row_scales():
    x = torch.randn(6, 16)
    scale_inv = torch.full((6,), 0.5)
    stats = torch.ops.fp8kit.cast_statistics
    q = (x * 2).to(torch.float8_e4m3fn)
    amax, *_ = stats(x, q, scale_inv, "per_row", False)
    assert amax.item() == x.abs().max().item()
    with pytest.raises(ValueError, match="one scale_inv per row"):
        stats(x, q, scale_inv[:5], "per_row", False)
    with pytest.raises(TypeError, match="float32"):
        stats(x, q, scale_inv.double(), "per_row", False)
    with pytest.raises(ValueError, match="from_columnwise=False"):
        stats(x, q.t().contiguous(), scale_inv, "per_row", True)
    with pytest.raises(ValueError, match="'per_row'"):
        stats(x, q, scale_inv, "per_rows", False)
