"""fp8kit.torch.inspect: per-layer FP8 cast statistics of a model's fp8kit
layers. The recorded statistics equal cast_statistics of the layers' own
FP8 copies (for the C++ Linear, copies made by its dispatcher-op twins on
a copy of its state: the same C++ code and bits), for Linear,
LayerNormLinear and LayerNormMLP under delayed, current and block
scaling; crafted inputs give the underflow and saturation counts they must;
training with inspection on is bit-identical to training without it
(losses, parameters, scaling state); lines are written at steps 0, N,
2N, ... only; and bad configurations are refused by name. The exactness
and bit-identity tests run on CUDA too (pytest -m gpu)."""

import numpy as np
import pytest
import torch

import fp8kit.torch as ft
from fp8kit.inspect import StatsLog, read_run
from fp8kit.inspect import writer as stats_writer
from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling, Format
from fp8kit.torch import _block_linear, _cast_records, _fused_steps
from fp8kit.torch._traced_linear import traced_state
from torch_reference import DEVICES, device_of

_ops = torch.ops.fp8kit
RECIPES = {"delayed": DelayedScaling(fp8_format=Format.HYBRID),
           "current": CurrentScaling(fp8_format=Format.HYBRID),
           "block": BlockScaling()}
FIELDS = ("amax", "underflow", "saturated", "error_sq", "norm_sq")


def layer(kind, dtype=torch.float32):
    if kind == "Linear":
        return ft.Linear(64, 32, dtype=dtype)
    if kind == "LayerNormLinear":
        return ft.LayerNormLinear(64, 32, dtype=dtype)
    return ft.LayerNormMLP(64, 96, activation="swiglu", normalization="RMSNorm", dtype=dtype)


@pytest.fixture
def log(tmp_path):
    """A path for the JSON lines."""
    return tmp_path / "stats.jsonl"


def steps_written(path) -> list:
    return [r["step"] for r in read_run(path)] if path.exists() else []


def device_for(name: str, recipe: str) -> torch.device:
    """device_of, skipping block scaling where the GPU's GEMMs lack it."""
    device = device_of(name)
    if recipe == "block" and not ft.supports_block_scaled_fp8_gemm(device):
        pytest.skip(f"{device} runs no block-scaled FP8 GEMM")
    return device


def run(model, x, recipe, dy=None):
    """One forward (inside autocast) and backward; the output."""
    with ft.autocast(recipe=recipe):
        y = model(x)
    y.backward(torch.ones_like(y) if dy is None else dy)
    return y
    return y


def stats_by_name(tensors) -> dict:
    return {t.name: t for t in tensors}


def assert_equal_stats(got, want: dict, what: str, device):
    """Equal; on CUDA the sums within the float32 atomics' order (the
    statistics header's bound), amax and the counts exact."""
    for f in FIELDS:
        rel = 1e-5 if device.type == "cuda" and f.endswith("_sq") else 0
        assert getattr(got, f) == pytest.approx(want[f], rel=rel, abs=0, nan_ok=True), (what, f)


def op_stats(x, data, scale_inv, mode="per_tensor", columnwise=False) -> dict:
    out = _ops.cast_statistics(x.detach(), data, scale_inv, mode, columnwise)
    return {f: v.item() for f, v in zip(FIELDS, out)}


# ---------------------------------------------------------------- (a) exact


def assert_row_equals(rows, slot: int, want: dict, device, what):
    """Row `slot` of an inspected call's statistics rows holds `want`."""
    columns = {name: i for i, name in enumerate(ft._ext.ext.STATISTICS_COLUMNS)}
    row = rows[slot].cpu()
    bits = row.view(torch.int32)
    got = {f: (bits if f in ("underflow", "saturated") else row)[columns[f]].item()
           for f in FIELDS}
    for f in FIELDS:
        rel = 1e-5 if device.type == "cuda" and f.endswith("_sq") else 0
        assert got[f] == pytest.approx(want[f], rel=rel, abs=0), (what, slot, f)
    assert row[columns["recorded"]].item() == 1, (what, slot)


class _BlockOps:
    """Stands in for torch.ops.fp8kit in fp8kit.torch._block_linear: each
    inspected call's statistics rows, slot, the tensor it cast and how."""

    def __init__(self):
        self.calls = []  # (rows, slot, tensor, scaling mode, FP8 dtype, eps, pow2)

    def block_linear_forward(self, x, w, b, fwd, eps, pow2, dgrad, wgrad, min_rows, stats):
        if stats is not None:
            self.calls += [(stats, 0, x, "block_1x128", fwd, eps, pow2),
                           (stats, 1, w, "block_128x128", fwd, eps, pow2)]
        return _ops.block_linear_forward(x, w, b, fwd, eps, pow2, dgrad, wgrad, min_rows, stats)

    def block_linear_backward(self, dy, *args):
        bwd, eps, pow2, stats = args[4], args[5], args[6], args[-1]
        if stats is not None:
            self.calls.append((stats, 2, dy, "block_1x128", bwd, eps, pow2))
        return _ops.block_linear_backward(dy, *args)


# Block scaling: the C++ block-scaled Linear's rows equal cast_statistics
# of the same tensors cast on their own (zero padding rows change no real
# tile, and count nothing).
@pytest.mark.parametrize("kind", ["Linear", "LayerNormLinear", "LayerNormMLP"])
@pytest.mark.parametrize("device", DEVICES)
def test_block_statistics_equal_cast_statistics(kind, device, monkeypatch, log):
    device = device_for(device, "block")
    torch.manual_seed(0)
    model = torch.nn.Sequential(layer(kind)).to(device)
    spy = _BlockOps()
    monkeypatch.setattr(_block_linear, "_ops", spy)
    with ft.inspect(model, every=1, log=log) as h:
        # 40 tokens: block scaling pads them to 48, which count nothing
        run(model, torch.randn(2, 20, 64, device=device, requires_grad=True), RECIPES["block"])
        h.flush()
    got = stats_by_name(h.last)
    gemms = ["0.fc1", "0.fc2"] if kind == "LayerNormMLP" else ["0"]
    assert set(got) == {f"{g}/{r}" for g in gemms for r in ("input", "weight", "grad_output")}
    assert len(spy.calls) == len(got)
    for rows, slot, x, mode, fp8, eps, pow2 in spy.calls:
        data, scales, _, _ = _ops.quantize_block(x, fp8, mode, True, False, eps, pow2)
        assert_row_equals(rows, slot, op_stats(x, data, scales, mode), device, kind)
    features = {"input": 64, "grad_output": 32}
    if kind == "LayerNormMLP":
        features = {"0.fc1/input": 64, "0.fc1/grad_output": 192, "0.fc2/input": 96,
                    "0.fc2/grad_output": 64}
    for name, t in got.items():
        assert t.scale is None
        role = name.split("/")[1]
        if role != "weight":
            assert t.numel == 40 * features.get(name, features.get(role)), name
        assert t.relative_error < 0.1


def _recipe_args(state) -> tuple:
    """A LinearState's recipe as the dispatcher ops take it."""
    r = state.recipe
    return (r["scaling"], r["forward_dtype"], r["backward_dtype"], r.get("margin", 0),
            r.get("amax_reduction", "max"), r.get("amax_epsilon", 0.0),
            r.get("power_2_scale", False))


class _StepSpy:
    """Wraps the fused layers' Linear steps (fp8kit.torch._fused_steps.EAGER,
    the C++ Linear's forward and backward): for each inspected call, the
    statistics the step must write, rebuilt from the casts it was given or
    returned, and, for dy's cast inside linear_backward, by the same slot
    cast on a copy of the state it started from."""

    def __init__(self, monkeypatch):
        self.wanted = []  # (statistics rows, slot, cast_statistics of the cast)
        eager = _fused_steps.EAGER
        forward, backward, cast_grad = (eager.linear_forward_cast_input, eager.linear_backward,
                                        eager.linear_backward_cast_grad)

        def spy_forward(st, name, x_data, x_sinv, weight, fp8_weight, bias, fast, record, dgrad,
                        wgrad, statistics=None, values=None, **kwargs):
            out = forward(st, name, x_data, x_sinv, weight, fp8_weight, bias, fast, record,
                          dgrad, wgrad, statistics, values, **kwargs)
            if statistics is not None:
                _, w_kept, w_sinv = out  # the weight's columnwise copy on TN devices
                self.wanted.append((statistics, 0, op_stats(values, x_data, x_sinv)))
                self.wanted.append((statistics, 1, op_stats(
                    weight, w_kept, w_sinv, columnwise=w_kept.shape != weight.shape)))
            return out

        def spy_backward(st, dy, *args, **kwargs):
            statistics = args[-1]
            if statistics is not None:
                before = tuple(t.clone() for t in st.tensors)
                data, _, sinv, _ = _ops.quantize_slot(dy, *before, *_recipe_args(st), 2, True,
                                                      True, False, None)
                self.wanted.append((statistics, 2, op_stats(dy, data, sinv)))
            return backward(st, dy, *args, **kwargs)

        def spy_cast_grad(st, data, columnwise, sinv, *args, **kwargs):
            statistics, values = args[-2:]
            if statistics is not None:
                copy = data if data is not None else columnwise
                self.wanted.append((statistics, 2, op_stats(values, copy, sinv,
                                                            columnwise=data is None)))
            return cast_grad(st, data, columnwise, sinv, *args, **kwargs)

        for name, fn in (("linear_forward_cast_input", spy_forward),
                         ("linear_backward", spy_backward),
                         ("linear_backward_cast_grad", spy_cast_grad)):
            monkeypatch.setattr(eager, name, staticmethod(fn))


@pytest.mark.parametrize("kind", ["LayerNormLinear", "LayerNormMLP"])
@pytest.mark.parametrize("recipe", ["delayed", "current"])
@pytest.mark.parametrize("device", DEVICES)
def test_fused_layer_statistics_equal_cast_statistics_of_their_casts(kind, recipe, device,
                                                                    monkeypatch, log):
    """The fused layers' GEMMs are the C++ Linear's steps on an input the
    norm or activation kernel cast: each row they write equals
    cast_statistics of that cast."""
    device = device_of(device)
    torch.manual_seed(0)
    model = torch.nn.Sequential(layer(kind)).to(device)
    spy = _StepSpy(monkeypatch)
    with ft.inspect(model, every=1, log=log) as h:
        for _ in range(2):  # the second step: delayed scaling's seeded scales
            spy.wanted.clear()
            run(model, torch.randn(2, 20, 64, device=device, requires_grad=True),
                RECIPES[recipe])
        h.flush()
    gemms = 2 if kind == "LayerNormMLP" else 1
    assert len(spy.wanted) == 3 * gemms
    for rows, slot, want in spy.wanted:
        assert_row_equals(rows, slot, want, device, kind)
    got = stats_by_name(h.last)
    assert all(t.numel == 40 * 64 for name, t in got.items() if name.endswith("/input")
               and "fc2" not in name)
    assert all(t.relative_error < 0.1 for t in got.values())


@pytest.mark.parametrize("recipe", ["delayed", "current"])
@pytest.mark.parametrize("tokens", [48, 20])
@pytest.mark.parametrize("device", DEVICES)
def test_cxx_linear_statistics_equal_cast_statistics_of_its_copies(recipe, tokens, device, log):
    device = device_of(device)
    torch.manual_seed(1)
    lin = ft.Linear(64, 32, device=device)
    model = torch.nn.Sequential(lin)
    r = RECIPES[recipe]
    with ft.inspect(model, every=1, log=log) as h:
        run(model, torch.randn(tokens, 64, device=device), r)  # seeds delayed scaling's slots
        h.flush()
        x = torch.randn(tokens, 64, device=device, requires_grad=True)
        # The dispatcher-op twin of the forward, on a copy of the state:
        # the same C++ forward, so the same FP8 copies.
        st, fast = traced_state(lin._fp8_states, r, lin.weight, False)
        before = tuple(t.clone() for t in st.tensors)
        _, x_q, x_sc, w_q, w_sc = _ops.linear_forward(x, lin.weight, lin.bias, *before,
                                                      *st.recipe, fast, True, True, True)
        captured = {}
        with ft.autocast(recipe=r):
            y = model(x)
        y.register_hook(lambda g: captured.setdefault("dy", g))
        after_forward = tuple(t.clone() for t in st.tensors)
        dy = torch.randn_like(y)
        y.backward(dy)
        h.flush()
    got = stats_by_name(h.last)
    for role, hp, q, sinv in (("input", x, x_q, x_sc), ("weight", lin.weight, w_q, w_sc)):
        cw = q.shape != hp.shape
        want = op_stats(hp, q, sinv, "per_tensor", cw)
        assert_equal_stats(got[f"0/{role}"], want, role, device)
        assert got[f"0/{role}"].scale == 1.0 / sinv.item()
    # dy's cast: the same slot cast on the state the backward started from.
    data, _, dy_sinv, _ = _ops.quantize_slot(captured["dy"], *after_forward, *st.recipe, 2, True,
                                             True, False, None)
    assert_equal_stats(got["0/grad_output"], op_stats(dy, data, dy_sinv), "grad_output",
                       device)
    assert got["0/grad_output"].numel == tokens * 32


def test_fp8_weight_reports_input_and_grad_output_only(log):
    torch.manual_seed(0)
    lin = ft.Linear(32, 48)
    quantizer = ft.Float8CurrentScalingQuantizer("e4m3", True, True)
    lin.weight = torch.nn.Parameter(quantizer(lin.weight.detach()))
    with ft.inspect(lin, every=1, log=log) as h:
        run(lin, torch.randn(20, 32), CurrentScaling())
    assert [t.name for t in h.last] == ["Linear/input", "Linear/grad_output"]


# ---------------------------------------------------------------- (a) crafted


@pytest.mark.parametrize("recipe", ["delayed", "current", "block"])
@pytest.mark.parametrize("kind", ["Linear", "LayerNormLinear", "LayerNormMLP"])
def test_crafted_values_underflow_and_saturate(kind, recipe, log):
    """Step 1: a weight column of huge values and one of tiny ones, and an
    output gradient likewise; Linear's input too."""
    torch.manual_seed(2)
    model = torch.nn.Sequential(layer(kind))
    m = model[0]
    w = m.fc1_weight if kind == "LayerNormMLP" else m.weight
    rows, tokens = w.shape[0], 16
    r = RECIPES[recipe]

    def values(rows, cols, lo):
        """Uniform magnitudes in [lo, 1), random signs."""
        return (lo + (1 - lo) * torch.rand(rows, cols)) * torch.where(
            torch.rand(rows, cols) < 0.5, -1.0, 1.0)
    n_out = 64 if kind == "LayerNormMLP" else 32
    with ft.inspect(model, every=1, log=log) as h:
        run(model, values(tokens, 64, 0.5), r, values(tokens, n_out, 0.5))
        with torch.no_grad():  # no value near 0 but the tiny ones
            w.copy_(values(*w.shape, 0.4) * 0.1)
            w[:, 0], w[:, 1] = 10.0, 1e-12
        x = values(tokens, 64, 0.25) * 0.5
        x[:, 0], x[:, 1] = 1e4, 1e-12
        dy = values(tokens, n_out, 0.25) * 0.5
        dy[:, 0], dy[:, 1] = 1e4, 1e-30
        # x wants a gradient: dy's rowwise copy, whose 1x128 tiles under
        # block scaling hold the huge and the tiny values together (its
        # columnwise tiles would each scale a column of its own).
        x.requires_grad_()
        run(model, x, r, dy)
        h.flush()
    got = stats_by_name(h.last)
    first = "0.fc1" if kind == "LayerNormMLP" else "0"
    last = "0.fc2" if kind == "LayerNormMLP" else "0"
    checks = [(f"{first}/weight", rows), (f"{last}/grad_output", tokens)]
    if kind == "Linear":
        checks.append(("0/input", tokens))
    for name, n in checks:
        t = got[name]
        assert t.underflow == n, name
        if recipe != "block":  # power-of-two block scales may stop short of fp8_max
            assert t.saturated >= n, name
        assert t.relative_error > 0.1 or recipe != "delayed", name  # clipped huge values


# ---------------------------------------------------------------- (b) bit-identical


def _net(dtype, device):
    torch.manual_seed(3)
    kw = {"dtype": dtype, "device": device}
    return torch.nn.Sequential(ft.Linear(32, 64, **kw), torch.nn.GELU(),
                               ft.LayerNormLinear(64, 64, **kw),
                               ft.LayerNormMLP(64, 128, normalization="RMSNorm",
                                               activation="swiglu", **kw),
                               ft.LayerNormMLP(64, 64, **kw),
                               ft.Linear(64, 16, **kw))


def _train(recipe, dtype, device, log=None):
    """Five SGD steps; inspected every 2nd when `log` is given."""
    model = _net(dtype, device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(4)
    handle = ft.inspect(model, every=2, log=log) if log is not None else None
    losses = []
    for _ in range(5):
        x = torch.randn(3, 16, 32, generator=g).to(device, dtype)
        with ft.autocast(recipe=recipe):
            loss = model(x).float().pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    if handle is not None:
        handle.close()
        assert steps_written(log) == [0, 2, 4]
        assert len(handle.last) == 3 * 7  # seven GEMMs
    states = []
    for m in model:
        held = getattr(m, "fp8_states", None) or ()
        for st in [s for v in held.values() for s in v] if isinstance(held, dict) else held:
            states += [st.amax_history, st.scale, st.scale_inv]
    return losses, list(model.parameters()), states


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("recipe", ["delayed", "current", "block"])
@pytest.mark.parametrize("device", DEVICES)
def test_training_is_bit_identical_with_inspection_on(recipe, dtype, device, log):
    device = device_for(device, recipe)
    off = _train(RECIPES[recipe], dtype, device)
    on = _train(RECIPES[recipe], dtype, device, log)
    for a, b in zip(off, on):
        assert len(a) == len(b)
        for u, v in zip(a, b):
            assert torch.equal(u, v)
    if recipe != "block":
        assert off[2]  # the states were compared


def test_tiny_decoder_trainer_is_bit_identical_and_logs(log):
    from fp8kit.models.config import LlamaConfig
    from fp8kit.models.schedule import TrainConfig
    from fp8kit.models.train_torch import TorchTrainer
    cfg = LlamaConfig(hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, seq_len=32)
    tcfg = TrainConfig(steps=5, batch=2, lr=3e-3, warmup_steps=2)
    plain = TorchTrainer(cfg, tcfg, DelayedScaling(), device="cpu")
    with StatsLog(log, every=2) as stats:
        inspected = TorchTrainer(cfg, tcfg, DelayedScaling(), device="cpu", statistics=stats)
        assert plain.train_steps(3) == inspected.train_steps(3)
        assert steps_written(log) == [0, 2]  # written before train_steps returns
        assert plain.train_step() == inspected.train_step()
        inspected.evaluate([np.ones((2, cfg.seq_len + 1), np.int64)])  # no step of its own
        assert plain.train_step() == inspected.train_step()
    for a, b in zip(plain.model.parameters(), inspected.model.parameters()):
        assert torch.equal(a, b)
    records = read_run(log)
    assert [r["step"] for r in records] == [0, 2, 4]
    names = {f"layers.{i}.{g}/{r}" for i in range(2) for g in ("qkv", "wo", "mlp.fc1", "mlp.fc2")
             for r in ("input", "weight", "grad_output")}
    assert set(records[0]["tensors"]) == names  # the names JaxTrainer writes
    assert all(r["framework"] == "torch" and r["recipe"] == "DelayedScaling" for r in records)
    with pytest.raises(ValueError, match="statistics are the casts"):
        TorchTrainer(cfg, tcfg, None, device="cpu", statistics=stats)


# ---------------------------------------------------------------- (c) when


def test_lines_are_written_at_steps_0_n_2n_only(log):
    torch.manual_seed(0)
    model = torch.nn.Sequential(ft.Linear(32, 32))
    h = ft.inspect(model, every=3, log=log)
    for _ in range(7):
        run(model, torch.randn(4, 32), RECIPES["current"])
        with torch.no_grad(), ft.autocast(recipe=RECIPES["current"]):
            model(torch.randn(4, 32))  # evaluation: not a step
        assert set(steps_written(log)) <= {0, 3}
    assert steps_written(log) == [0, 3]  # step 6 waits for the next step or close()
    h.close()
    records = read_run(log)
    assert [r["step"] for r in records] == [0, 3, 6]
    assert records[0]["framework"] == "torch" and records[0]["recipe"] == "CurrentScaling"
    assert list(records[0]["tensors"]) == ["0/input", "0/weight", "0/grad_output"]


def test_explicit_steps_with_gradient_accumulation_merge_micro_batches(log):
    torch.manual_seed(0)
    model = torch.nn.Sequential(ft.LayerNormLinear(32, 32), ft.Linear(32, 32))
    with ft.inspect(model, every=2, log=log) as h:
        for step in range(10, 15):
            h.step(step)
            for _ in range(3):  # micro-batches
                run(model, torch.randn(4, 32), RECIPES["delayed"])
    assert steps_written(log) == [10, 12, 14]
    assert all(t.numel == 3 * 4 * 32 for t in h.last if t.role != "weight")
    assert {t.name for t in h.last} == {f"{i}/{r}" for i in "01"
                                        for r in ("input", "weight", "grad_output")}


def test_filters_names_tensorboard_and_cleanup(log, tmp_path, monkeypatch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(ft.Linear(32, 64), ft.LayerNormMLP(64, 64), ft.Linear(64, 32))
    scalars = []

    class Writer:  # a TensorBoard summary writer
        def __init__(self, logdir):
            pass

        def add_scalar(self, tag, value, step):
            scalars.append((tag, value, step))

        def flush(self):
            pass

        def close(self):
            pass
    monkeypatch.setattr(stats_writer, "summary_writer_class", lambda: Writer)
    with ft.inspect(model, every=1, log=log, tensorboard=tmp_path / "tb",
                    layers=["1.fc2", "2"], roles="weight", names=lambda n: f"net.{n}") as h:
        assert h.layers == ["net.1.fc2", "net.2"]
        assert all(m._fp8_inspect is None for m in model)  # set only while a step runs
        run(model, torch.randn(8, 32), RECIPES["delayed"])
    assert [t.name for t in h.last] == ["net.1.fc2/weight", "net.2/weight"]
    tags = {tag for tag, _, step in scalars if step == 0}
    assert {"net.1.fc2/weight/amax", "net.2/weight/relative_error"} <= tags
    # Closed: the model is as it was.
    assert not model._forward_pre_hooks and not model._forward_hooks
    assert all("_fp8_inspect" not in m.__dict__ for m in model.modules())
    with ft.inspect(model, every=1, log=log, layers="1") as h:  # the module: both GEMMs
        run(model, torch.randn(8, 32), RECIPES["current"])
    assert {t.layer for t in h.last} == {"1.fc1", "1.fc2"}
    with StatsLog(log, every=2) as stats:  # a log of one's own: its every, left open
        with ft.inspect(model, log=stats) as h:
            for _ in range(3):
                run(model, torch.randn(8, 32), RECIPES["current"])
        stats.write(7, "torch", "x", [])
    assert steps_written(log) == [0, 2, 7]


def test_a_step_without_fp8_warns_and_writes_nothing(log):
    model = torch.nn.Sequential(ft.Linear(32, 32))
    with pytest.warns(UserWarning, match="inside fp8kit.torch.autocast"):
        with ft.inspect(model, every=1, log=log):
            model(torch.randn(4, 32)).sum().backward()  # outside autocast
    assert steps_written(log) == []


def test_a_resumed_run_appends(log):
    model = torch.nn.Sequential(ft.Linear(32, 32))
    for append in (False, True):
        with ft.inspect(model, every=1, log=log, append=append):
            run(model, torch.randn(4, 32), RECIPES["current"])
    assert len(log.read_text().splitlines()) == 2


# ---------------------------------------------------------------- (d) errors


def test_bad_configurations_are_refused_by_name(log):
    model = torch.nn.Sequential(ft.Linear(32, 32), ft.LayerNormMLP(32, 64))
    for every in (0, -3, 2.0, True, "10"):
        with pytest.raises(ValueError, match=r"fp8kit.torch.inspect: every=.* must be an int"):
            ft.inspect(model, every=every, log=log)
    with pytest.raises(ValueError, match="holds no fp8kit FP8 layer"):
        ft.inspect(torch.nn.Sequential(torch.nn.Linear(4, 4)), log=log)
    with pytest.raises(ValueError, match=r"layers pattern 'layers\.0\.\*' matches no fp8kit "
                                         r"layer.*'0', '1.fc1', '1.fc2'"):
        ft.inspect(model, log=log, layers=["0", "layers.0.*"])
    with pytest.raises(ValueError, match="roles="):
        ft.inspect(model, log=log, roles=["bias"])
    with pytest.raises(ValueError, match="names gives two GEMMs one name"):
        ft.inspect(model, log=log, names=lambda n: "same")
    with pytest.raises(TypeError, match="log must be a path"):
        ft.inspect(model)
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        ft.inspect("model", log=log)
    with pytest.raises(ValueError, match="is compiled"):
        ft.inspect(torch.compile(model, backend="eager"), log=log)
    assert not log.exists()  # refused before the file was made
    with StatsLog(log, every=5) as stats:
        with pytest.raises(ValueError, match=r"log is a StatsLog, which has its own every \(5\)"):
            ft.inspect(model, every=10, log=stats)
    with ft.inspect(model, log=log) as h:
        with pytest.raises(RuntimeError, match="layer '1.fc1' is already inspected"):
            ft.inspect(model, log=log, layers="1")
        with pytest.raises(ValueError, match=r"step\(n\)"):
            h.step(-1)
    ft.inspect(model, log=log).close()  # free again
    with pytest.raises(RuntimeError, match="closed handle"):
        h.step(3)


def test_an_inspected_layer_refuses_tracing():
    model = torch.nn.Sequential(ft.Linear(32, 32))
    rec = _cast_records.LayerRecorder(_cast_records.StepRecords(0, frozenset()), {"": "0"})
    model[0]._fp8_inspect = rec

    def f(x):
        with ft.autocast(recipe=RECIPES["current"]):
            return model(x)
    with pytest.raises(Exception, match="inspection runs eagerly only"):
        torch.compile(f, backend="eager", fullgraph=True)(torch.randn(4, 32))
