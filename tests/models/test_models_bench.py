"""python -m fp8kit.models.bench on the CPU with the tiny config: every
(framework, recipe, mode) run trains, in its own process, and reports;
--compile adds compiled PyTorch runs; a peer that is missing or a model
that does not compile is reported, not fatal."""

import dataclasses
import importlib.util
import json
import sys

import pytest
import torch

from fp8kit.bench import te_peer
from fp8kit.models import bench, bench_peers, bench_table
from fp8kit.models.config import CONFIGS
from fp8kit.models.train_torch import TorchTrainer

SMOKE = ["--config", "tiny", "--layers", "1", "--seq-len", "32", "--batch", "2", "--warmup",
         "1", "--steps", "2"]


def test_smoke_run_reports_every_framework_and_recipe(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert bench.main(SMOKE + ["--json", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert "2 x seq 32 = 64 tokens/step" in stdout
    assert "fp8kit's fused layers with bf16 seams" in stdout   # the default
    doc = json.loads(out.read_text())
    assert doc["fp8kit_seams"] == "bf16"
    runs = {(r["framework"], r["recipe"], r["mode"]): r for r in doc["runs"]}
    assert set(runs) == {(f, r, "eager" if f == "torch" else "jit")
                         for f in bench.FRAMEWORKS for r in bench.RECIPES}
    for r in runs.values():
        assert r["tokens_per_s"] > 0 and r["step_ms"] > 0
        assert 3.0 < r["last_loss"] < 6.0             # trained from ln(256) = 5.5
        assert 5.0 < r["first_loss"] < 6.5            # the untrained model's
        assert r["diverged"] is False
        assert r["peak_memory_bytes"] is None          # no device allocator on a CPU
        assert r["accumulation"] == (None if r["recipe"] == "bf16" else "split")
        assert f"{r['framework']:<9} {r['recipe']:<12} {r['mode']:<7} cpu" in stdout
    assert doc["model"]["layers"] == 1 and doc["model"]["hidden"] == 128


def test_mixture_of_experts_runs_report_their_routing_balance(tmp_path, capsys):
    """An MoE row says how evenly its router spread the tokens while it was
    timed (collapsed routing times one expert doing every token's work);
    a dense row has no such reading."""
    out = tmp_path / "bench.json"
    args = ["--config", "moe_tiny", "--layers", "1", "--seq-len", "32", "--batch", "2",
            "--warmup", "1", "--steps", "2", "--frameworks", "torch,jax", "--recipes", "bf16",
            "--json", str(out)]
    assert bench.main(args) == 0
    stdout = capsys.readouterr().out
    runs = json.loads(out.read_text())["runs"]
    experts, top_k = CONFIGS["moe_tiny"].experts, CONFIGS["moe_tiny"].top_k
    for r in runs:
        # E * sum_e f_e P_e lies in [1, E / top_k] up to the probabilities'
        # spread; an untrained router is near even.
        assert 0.9 < r["routing_balance"] <= experts / top_k
    assert "routing balance over the timed steps (load-balancing loss per layer; 1 is even): " \
           f"torch bf16 eager {runs[0]['routing_balance']:.2f}, jax bf16 jit " \
           f"{runs[1]['routing_balance']:.2f}" in stdout
    dense = {**runs[0], "recipe": "delayed"}
    del dense["routing_balance"]
    assert "routing balance" not in bench_table.table([dense])


def test_balanced_routing_times_every_expert_alike(tmp_path, capsys):
    """--balanced-routing: the MoE runs route round-robin, so their routing
    balance is 1 (f_e = 1 / E for every expert); a dense config refuses
    the flag before any run."""
    out = tmp_path / "bench.json"
    args = ["--config", "moe_tiny", "--layers", "1", "--seq-len", "32", "--batch", "2",
            "--warmup", "1", "--steps", "2", "--frameworks", "torch", "--recipes", "bf16",
            "--balanced-routing", "--json", str(out)]
    assert bench.main(args) == 0
    doc = json.loads(out.read_text())
    assert doc["model"]["router_balanced"] is True
    assert doc["runs"][0]["routing_balance"] == pytest.approx(1.0, abs=1e-5)
    capsys.readouterr()
    assert bench.main(SMOKE + ["--balanced-routing"]) == 2
    assert "--balanced-routing: config tiny is dense" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is not None,
                    reason="TransformerEngine is installed: its rows would run")
def test_transformer_engine_rows_say_why_they_did_not_run(capsys):
    """The TE peer recipes are optional: without TransformerEngine each one
    reports why in the table, in both frameworks (the other runs go on)."""
    assert bench.main(SMOKE + ["--recipes", "bf16,te-current"]) == 0
    out = capsys.readouterr().out
    assert ("torch     te-current   eager   not run: TransformerEngine (PyTorch) not available"
            in out)
    assert "jax       te-current   jit     not run: TransformerEngine (JAX) not available" in out
    assert out.count("  1.00 ") == 2   # each framework's bf16 against itself


def test_compile_runs_each_torch_recipe_eager_and_compiled(tmp_path, capsys):
    """Each compiled run is compared with the compiled bf16 run."""
    out = tmp_path / "bench.json"
    assert bench.main(SMOKE + ["--frameworks", "torch", "--recipes", "bf16,delayed",
                               "--compile", "--json", str(out)]) == 0
    stdout = capsys.readouterr().out
    results = json.loads(out.read_text())["runs"]
    runs = [(r["recipe"], r["mode"]) for r in results]
    assert runs == [("bf16", "eager"), ("bf16", "compile"), ("delayed", "eager"),
                    ("delayed", "compile")]
    bf16 = {r["mode"]: r["tokens_per_s"] for r in results if r["recipe"] == "bf16"}
    for r in results:
        # The row's 'x bf16' column: its tokens/s over the bf16 run's of its
        # own mode (1.00 for the bf16 runs themselves).
        ratio = f"{r['tokens_per_s'] / bf16[r['mode']]:6.2f}"
        acc = r["accumulation"] or "-"
        row = (f"torch     {r['recipe']:<12} {r['mode']:<7} cpu      {acc:<8} | "
               f"{r['tokens_per_s']:10.0f} {ratio} ")
        assert row in stdout, (row, stdout)


def test_compile_only_leaves_the_eager_runs_out(tmp_path):
    out = tmp_path / "bench.json"
    assert bench.main(SMOKE + ["--frameworks", "torch,jax", "--recipes", "bf16,delayed",
                               "--compile-only", "--json", str(out)]) == 0
    runs = [(r["framework"], r["recipe"], r["mode"]) for r in json.loads(out.read_text())["runs"]]
    assert runs == [("torch", "bf16", "compile"), ("torch", "delayed", "compile"),
                    ("jax", "bf16", "jit"), ("jax", "delayed", "jit")]


def test_float32_seams_reach_the_fp8kit_layers_of_both_frameworks(tmp_path, monkeypatch,
                                                                  capsys):
    """--float32-seams builds fp8kit's fused layers with float32 seams (bf16
    ones by default) in both frameworks, in the runs' own processes, and the
    JSON says which."""
    out = tmp_path / "bench.json"
    assert bench.main(SMOKE + ["--recipes", "delayed", "--float32-seams", "--json",
                               str(out)]) == 0
    assert "fp8kit's fused layers with float32 seams" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["fp8kit_seams"] == "float32" and len(doc["runs"]) == 2
    assert all("error" not in r for r in doc["runs"])
    seen = []
    for name in ("torch_trainer", "jax_trainer"):
        made = getattr(bench, name)
        def spy(*args, made=made, **kwargs):
            made_trainer = made(*args, **kwargs)
            trainer = made_trainer[0]
            layers = (trainer.model.layers[0].mlp.fp8 if trainer.framework == "torch"
                      else trainer.layers)
            seen.append(layers.float32_seams)
            return made_trainer
        monkeypatch.setattr(bench, name, spy)
    cfg = dataclasses.replace(CONFIGS["tiny"], layers=1, seq_len=32)
    for framework in ("torch", "jax"):
        for seams in ({}, {"float32_seams": True}):   # the default, then the opt-in
            bench.measure(framework, cfg, "delayed", "eager" if framework == "torch" else "jit",
                          batch=2, warmup=0, steps=1, **seams)
    assert seen == [False, True, False, True]


@pytest.mark.skipif(importlib.util.find_spec("torchao") is not None,
                    reason="torchao is installed: its row would run")
def test_torchao_row_says_why_it_did_not_run(capsys):
    assert bench.main(SMOKE + ["--frameworks", "torch,jax", "--recipes", "torchao",
                               "--compile"]) == 0
    out = capsys.readouterr().out
    assert "torch     torchao      compile not run: torchao is not installed" in out
    assert "jax       torchao" not in out


def test_a_model_that_does_not_compile_is_reported(monkeypatch):
    """A graph break under fullgraph=True (as a peer's layers may have)
    fails the run's first warm-up step; the run reports dynamo's reason."""
    def objective_with_a_break(self, batch):
        torch._dynamo.graph_break()
        loss = self.model(batch[:, :-1]).float().mean()
        return loss, loss, None

    monkeypatch.setattr(TorchTrainer, "objective", objective_with_a_break)
    cfg = dataclasses.replace(CONFIGS["tiny"], layers=1, seq_len=32)
    torch._dynamo.reset()
    try:
        run = bench.measure("torch", cfg, "bf16", "compile", batch=2, warmup=1, steps=1)
    finally:
        torch._dynamo.reset()
    assert run["error"].startswith("torch.compile failed: Unsupported: ")
    assert (run["framework"], run["recipe"], run["mode"]) == ("torch", "bf16", "compile")
    assert "tokens_per_s" not in run


@pytest.mark.parametrize("args,message", [
    (["--seq-len", "2000000"], "--seq-len 2000000: the training text has"),
    (["--recipes", "fp4"], "--recipes: unknown ['fp4']"),
    (["--recipes", "bf16,torchao"], "--recipes torchao runs compiled only"),
    (["--compile", "--warmup", "0"], "--warmup=0 with --compile would time the compilation"),
    (["--frameworks", "mxnet"], "--frameworks: unknown ['mxnet']"),
    (["--steps", "0"], "--steps=0 is too small"),
    (["--config", "tiny", "--seq-len", "0"], "seq_len must be an int >= 1"),
    (["--forward-fast-accumulation", "--recipes", "bf16,block"],
     "--forward-fast-accumulation changes fp8kit's delayed and current runs"),
    (["--te-jax-split-accumulation", "--frameworks", "torch", "--recipes", "te-delayed"],
     "--te-jax-split-accumulation changes TE-JAX's runs"),
    (["--te-jax-split-accumulation", "--recipes", "delayed,te-block"],
     "--te-jax-split-accumulation changes TE-JAX's runs"),
])
def test_bad_arguments_are_reported(args, message, capsys):
    assert bench.main(args) == 2
    assert message in capsys.readouterr().err


def test_unwritable_json_is_refused_before_any_run(tmp_path, capsys):
    (tmp_path / "a_file").write_text("")
    assert bench.main(SMOKE + ["--json", str(tmp_path / "a_file" / "b.json")]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"error: --json: {tmp_path / 'a_file'} exists and is not a directory\n"


def test_missing_framework_is_named_before_any_run(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "jax", None)   # as if not installed
    assert bench.main(SMOKE) == 2
    assert capsys.readouterr().err == (
        "error: jax is not installed (the benchmark trains in it): pip install 'fp8kit[jax]', "
        "or leave it out of --frameworks\n")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU run makes no CPU disclaimer")
def test_cpu_table_says_its_numbers_are_not_performance_claims(tmp_path, monkeypatch, capsys):
    """...and --json naming a directory writes models_bench.json inside it."""
    def run(fn, framework, model_cfg, recipe, mode, *args):   # made-up numbers, at once
        return {"framework": framework, "recipe": recipe, "mode": mode, "device": "cpu",
                "tokens_per_s": 1000.0, "step_ms": 1.0, "peak_memory_bytes": None,
                "last_loss": 5.0, "diverged": False}
    monkeypatch.setattr(bench, "_in_fresh_process", run)
    assert bench.main(SMOKE + ["--json", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[-1] == bench.CPU_NOTE and lines[-2].startswith("jax       block")
    assert "fp8kit's reference kernels" in lines[-1] and "not performance claims" in lines[-1]
    assert len(json.loads((tmp_path / "models_bench.json").read_text())["runs"]) == 8
    assert captured.err == ""                    # a tiny run: no estimate warning


@pytest.mark.skipif(torch.cuda.is_available(), reason="the warning is for CPU runs")
@pytest.mark.parametrize("config", ["1b", "8b_slice"])
def test_gpu_sized_config_on_the_cpu_warns_up_front(config, monkeypatch, capsys):
    class FirstRun(Exception):
        pass

    def first_run(*args):
        raise FirstRun   # stops main before anything trains
    monkeypatch.setattr(bench, "_in_fresh_process", first_run)
    with pytest.raises(FirstRun):
        bench.main(["--config", config])
    err = capsys.readouterr().err
    assert err.startswith("warning: 8 training run(s) of a "), err
    assert " by an estimate (not a measurement" in err and "meant for a GPU" in err


def test_cpu_runs_pin_torch_to_one_thread(monkeypatch):
    """As the demo does: PyTorch's thread pool, spin-waiting on a small
    machine, made the bf16 runs' speed and so the ratios vary from run to
    run."""
    threads = []
    monkeypatch.setattr(torch, "set_num_threads", threads.append)
    cfg = dataclasses.replace(CONFIGS["tiny"], layers=1, seq_len=32)
    bench.measure("torch", cfg, "bf16", "eager", batch=1, warmup=0, steps=1)
    assert threads == ([] if torch.cuda.is_available() else [1])


def test_a_run_far_above_its_start_is_marked_diverged():
    """The bench flags a run whose loss ends more than a nat above where it
    started, its first loss or ln(vocab) where that is higher (the bf16
    8b_slice at the peak learning rate from step 0 ended at 18.2), and a
    non-finite one; a run near the start (ln 256 = 5.55) is not."""
    cfg = CONFIGS["tiny"]
    assert [bench.diverged(x, cfg) for x in (5.6, 6.5, 7.6, 18.2, float("nan"), float("inf"))] \
        == [False, False, True, True, True, True]
    # A wide model starts above ln(vocab): a nat above its own start.
    assert [bench.diverged(x, cfg, 6.6) for x in (7.5, 7.7, 18.2)] == [False, True, True]
    # A start below ln(vocab), or none, keeps ln(vocab) as the start.
    assert [bench.diverged(7.0, cfg, f) for f in (4.0, float("nan"), None)] == [True] * 3
    assert not bench.diverged(6.5, cfg, 4.0)
    row = {"framework": "torch", "recipe": "bf16", "mode": "eager", "device": "cuda",
           "tokens_per_s": 1.0, "step_ms": 1.0, "peak_memory_bytes": None, "last_loss": 18.2,
           "diverged": True}
    assert bench_table.table([row]).splitlines()[-1].endswith("18.200 diverged")


def test_measured_runs_warm_the_learning_rate_up_like_training():
    """The measured steps start at the training recipe's warmup, not at the
    peak learning rate."""
    from fp8kit.models.schedule import TrainConfig, learning_rate
    cfg = bench.train_config(batch=8, warmup=5, steps=30)
    assert (cfg.steps, cfg.batch, cfg.warmup_steps) == (35, 8, TrainConfig().warmup_steps)
    assert learning_rate(0, cfg) < cfg.lr / 10
    assert cfg.lr == TrainConfig().lr
    assert bench.train_config(batch=8, warmup=5, steps=30, lr=3e-4).lr == 3e-4


def test_mixtral_slice_trains_at_its_own_learning_rate(monkeypatch, capsys, tmp_path):
    """mixtral_slice's runs peak at 3e-4 (schedule.PEAK_LEARNING_RATES says
    why); the dense configs keep TrainConfig's rate."""
    from fp8kit.models.schedule import TrainConfig, peak_learning_rate
    assert peak_learning_rate("mixtral_slice") == 3e-4
    for config in ("tiny", "1b", "8b_slice", "moe_tiny"):
        assert peak_learning_rate(config) == TrainConfig().lr
    seen = []

    def run(fn, framework, model_cfg, recipe, mode, batch, warmup, steps, seams, every, lr,
            *accumulation):
        seen.append(lr)
        return {"framework": framework, "recipe": recipe, "mode": mode, "device": "cpu",
                "tokens_per_s": 1000.0, "step_ms": 1.0, "peak_memory_bytes": None,
                "last_loss": 5.0, "first_loss": 6.0, "diverged": False}
    monkeypatch.setattr(bench, "_in_fresh_process", run)
    monkeypatch.setattr(bench, "_long_cpu_run", lambda *args: None)
    out = tmp_path / "bench.json"
    assert bench.main(["--config", "mixtral_slice", "--frameworks", "torch", "--recipes",
                       "bf16", "--json", str(out)]) == 0
    assert seen == [3e-4]
    assert "at peak learning rate 0.0003;" in capsys.readouterr().out
    assert json.loads(out.read_text())["peak_lr"] == 3e-4


def test_inspect_every_adds_an_inspected_run_after_each_fp8kit_one(monkeypatch, capsys):
    def run(fn, framework, model_cfg, recipe, mode, batch, warmup, steps, seams, every, lr,
            *accumulation):
        label = f"{recipe}/i{every}" if every else recipe
        return {"framework": framework, "recipe": label, "mode": mode, "device": "cpu",
                "tokens_per_s": 900.0 if every else 1000.0, "step_ms": 1.0,
                "peak_memory_bytes": None, "last_loss": 5.0, "diverged": False,
                **({"inspect_every": every} if every else {})}
    monkeypatch.setattr(bench, "_in_fresh_process", run)
    args = ["--config", "tiny", "--frameworks", "torch", "--recipes", "bf16,delayed,te-current",
            "--warmup", "2", "--steps", "1", "--inspect-every", "5"]
    assert bench.main(args) == 0
    out = capsys.readouterr().out
    recipes = [line.split()[1] for line in out.splitlines() if line.startswith("torch     ")]
    assert recipes == ["bf16", "delayed", "delayed/i5", "te-current"]
    assert ("statistics every 5 steps: torch delayed eager runs at 0.900 of its tokens/s "
            "without them") in out


@pytest.mark.parametrize("flags, message", [
    (["--inspect-every", "-1"], "--inspect-every=-1 must be >= 0"),
    (["--inspect-every", "10", "--warmup", "1"], "use --warmup >= 2"),
])
def test_inspect_every_is_checked_before_any_run(flags, message, capsys):
    assert bench.main(SMOKE + flags) == 2
    assert message in capsys.readouterr().err


def test_forward_fast_accumulation_reaches_fp8kit_per_tensor_recipes(tmp_path):
    """The flag sets the recipes' opt-in, and the rows say so (block
    scaling has no fast mode, bf16 no FP8 GEMM)."""
    assert bench._recipe("delayed", True).forward_fast_accumulation is True
    assert bench._recipe("current", True).forward_fast_accumulation is True
    assert bench._recipe("current").forward_fast_accumulation is False
    out = tmp_path / "bench.json"
    assert bench.main(SMOKE + ["--frameworks", "torch", "--recipes", "bf16,delayed,block",
                               "--forward-fast-accumulation", "--json", str(out)]) == 0
    runs = {r["recipe"]: r["accumulation"] for r in json.loads(out.read_text())["runs"]}
    assert runs == {"bf16": None, "delayed": "fast fwd", "block": "split"}


@pytest.mark.parametrize("framework,recipe,forward_fast,te_env,expected", [
    ("torch", "bf16", False, None, None),
    ("jax", "delayed", False, None, "split"),
    ("jax", "current", True, None, "fast fwd"),
    ("torch", "block", True, None, "split"),
    ("torch", "te-delayed", False, None, "fast fwd"),   # TE-PyTorch: forward fast
    ("torch", "te-block", False, None, "split"),
    ("torch", "torchao", False, None, "fast fwd"),
    ("jax", "te-current", False, None, "fast"),          # TE-JAX: every GEMM fast
    ("jax", "te-delayed", False, "1", "split"),          # unless its variable says split
])
def test_each_run_names_its_accumulation(framework, recipe, forward_fast, te_env, expected,
                                         monkeypatch):
    if te_env is None:
        monkeypatch.delenv(bench_peers.TE_JAX_SPLIT_ENV, raising=False)
    else:
        monkeypatch.setenv(bench_peers.TE_JAX_SPLIT_ENV, te_env)
    assert bench_peers.accumulation(framework, recipe, forward_fast) == expected


@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is not None,
                    reason="TransformerEngine is installed: the TE-JAX trainer would be built")
def test_te_jax_split_accumulation_sets_te_s_variable_before_its_layers(monkeypatch):
    monkeypatch.delenv(bench_peers.TE_JAX_SPLIT_ENV, raising=False)
    cfg = dataclasses.replace(CONFIGS["tiny"], layers=1, seq_len=32)
    with pytest.raises(RuntimeError, match="TransformerEngine"):
        bench.jax_trainer(cfg, bench.train_config(2, 1, 2), "te-delayed", None, te_split=True)
    assert bench_peers.accumulation("jax", "te-delayed", False) == "split"


def test_torch_runs_on_different_cudnn_versions_are_flagged():
    """A peer that loads its own cuDNN changes torch's attention kernels
    under its rows: the table says so, and says nothing when all agree."""
    def row(recipe, cudnn):
        return {"framework": "torch", "recipe": recipe, "mode": "eager", "device": "cuda",
                "accumulation": "split", "tokens_per_s": 1000.0, "step_ms": 1.0,
                "peak_memory_bytes": None, "last_loss": 5.0, "diverged": False, "cudnn": cudnn}
    same = bench_table.table([row("delayed", 91002), row("te-delayed", 91002)])
    assert "cuDNN" not in same
    mixed = bench_table.table([row("delayed", 91002), row("te-delayed", 90100)])
    assert ("the PyTorch runs loaded different cuDNN versions (delayed eager 91002, "
            "te-delayed eager 90100)") in mixed
    assert "first on LD_LIBRARY_PATH" in mixed


def test_torch_runs_on_cudnn_libraries_from_two_folders_are_flagged():
    """One version number, but torch's cuDNN and the system's both mapped
    (cuDNN loads its sub-libraries as it needs them): flagged too."""
    def row(recipe, folders):
        return {"framework": "torch", "recipe": recipe, "mode": "eager", "device": "cuda",
                "accumulation": "split", "tokens_per_s": 1000.0, "step_ms": 1.0,
                "peak_memory_bytes": None, "last_loss": 5.0, "diverged": False,
                "cudnn": 91900, "cudnn_folders": folders}
    torch_lib = "/venv/nvidia/cudnn/lib"
    one = bench_table.table([row("delayed", [torch_lib]), row("te-delayed", [torch_lib])])
    assert "cuDNN" not in one
    two = bench_table.table([row("delayed", [torch_lib]),
                             row("te-delayed", ["/usr/lib/x86_64-linux-gnu", torch_lib])])
    assert ("the PyTorch runs loaded cuDNN libraries from 2 folders "
            f"(/usr/lib/x86_64-linux-gnu, {torch_lib})") in two
    assert "first on LD_LIBRARY_PATH" in two


def test_loaded_cudnn_folders_reads_the_process_maps(tmp_path):
    """The folders of every mapped libcudnn*, once each; none where the
    maps file cannot be read."""
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 00000000 08:01 1 /venv/nvidia/cudnn/lib/libcudnn.so.9\n"
        "7f01-7f02 r--p 00001000 08:01 1 /venv/nvidia/cudnn/lib/libcudnn.so.9\n"
        "7f02-7f03 r-xp 00000000 08:01 2 /usr/lib/x86_64-linux-gnu/libcudnn_graph.so.9\n"
        "7f03-7f04 r-xp 00000000 08:01 3 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        "7f04-7f05 rw-p 00000000 00:00 0\n")
    assert te_peer.loaded_cudnn_folders(str(maps)) == ["/usr/lib/x86_64-linux-gnu",
                                                       "/venv/nvidia/cudnn/lib"]
    assert te_peer.loaded_cudnn_folders(str(tmp_path / "missing")) == []
