"""python -m fp8kit.demo on the CPU, small: it trains the decoder in FP8
and bf16 in both frameworks, prints progress and the table, writes the PNG
and the JSON, and the FP8 runs learn as the bf16 runs do."""

import contextlib
import dataclasses
import io
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("jax")
pytest.importorskip("torch")
pytest.importorskip("matplotlib")

from fp8kit import demo  # noqa: E402

STEPS = 12
# A one-layer decoder on 4 x 32 tokens per step: about 20 s on 2 CPU cores.
SMALL = ["--steps", str(STEPS), "--batch", "4", "--seq-len", "32", "--hidden", "64",
         "--layers", "1", "--ffn", "128", "--cpu"]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "loss.png"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = demo.main(SMALL + ["--out", str(out)])
    return rc, buf.getvalue(), out


def _runs(out):
    doc = json.loads(out.with_suffix(".json").read_text())
    return doc, {(r["framework"], r["precision"]): r for r in doc["runs"]}


def test_prints_progress_and_the_table(demo_run):
    rc, stdout, out = demo_run
    assert rc == 0, stdout
    for label in ("jax FP8", "jax bf16", "torch FP8", "torch bf16"):
        assert f"[{label}" in stdout                       # progress lines
    rows = [ln for ln in stdout.splitlines() if ln.startswith(("jax ", "torch ")) and "|" in ln]
    assert len(rows) == 4, stdout                            # one table row per run
    assert "tokens/s" in stdout and "held-out" in stdout
    assert "4 x 32 = 128 tokens" in stdout
    assert str(out.resolve()) in stdout


def test_writes_png_and_json(demo_run):
    _, _, out = demo_run
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 10_000
    doc, runs = _runs(out)
    assert set(runs) == {("jax", "FP8"), ("jax", "bf16"), ("torch", "FP8"), ("torch", "bf16")}
    for r in runs.values():
        assert len(r["losses"]) == STEPS
        assert r["device"] == "cpu"
        assert r["tokens_per_s"] > 0
    assert doc["model"]["hidden"] == 64 and doc["train"]["batch"] == 4


def test_logs_and_summarises_the_fp8_runs_cast_statistics(demo_run):
    """By default each FP8 run logs its casts' statistics 20 times (every
    STEPS // 20 = 1 step here) beside the plot, and the demo prints which
    casts lose most and plots each file."""
    from fp8kit.inspect import read_run
    rc, stdout, out = demo_run
    assert rc == 0, stdout
    for fw in ("jax", "torch"):
        path = out.with_name(f"{out.stem}_fp8_{fw}.jsonl")
        records = read_run(path)
        assert [r["step"] for r in records] == list(range(STEPS))
        assert {r["framework"] for r in records} == {fw}
        names = set(records[0]["tensors"])
        assert {"layers.0.wo/input", "layers.0.mlp.fc2/weight",
                "layers.0.qkv/grad_output"} <= names, names
        assert path.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
        assert f"{path.name}: {fw}" in stdout
    assert "FP8 cast statistics, every 1 steps" in stdout
    assert "highest mean relative error" in stdout


def test_inspect_every_zero_writes_no_statistics(tmp_path):
    out = tmp_path / "loss.png"
    with contextlib.redirect_stdout(io.StringIO()):
        assert demo.main(SMALL + ["--frameworks", "jax", "--steps", "2", "--inspect-every",
                                  "0", "--out", str(out)]) == 0
    assert not list(tmp_path.glob("*.jsonl"))


@pytest.mark.parametrize("frameworks", [["torch"], ["jax", "torch"]])
def test_plot_title_fits_the_figure(frameworks, tmp_path, monkeypatch):
    """The title wraps to the figure's width: with one framework's column it
    used to run off both edges."""
    import matplotlib.pyplot as plt
    from fp8kit.demo import report
    from fp8kit.demo.result import RunResult
    from fp8kit.models.config import CONFIGS
    from fp8kit.models.schedule import TrainConfig
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)   # keep the figure to measure it
    results = [RunResult(fw, p, "cuda", [3.0] * 1000, 2.5, 1e4, 70.0)
               for fw in frameworks for p in ("FP8", "bf16")]
    report.plot(results, CONFIGS["1b"], TrainConfig(steps=1000, batch=1),
                "delayed scaling, HYBRID format, float32 seams", tmp_path / "loss.png")
    (fig,) = figures
    renderer = fig.canvas.get_renderer()
    (title,) = [t.get_window_extent(renderer) for t in fig.texts
                if t.get_text() == fig.get_suptitle()]
    box = fig.bbox
    assert box.x0 <= title.x0 and title.x1 <= box.x1, (title, box)
    plt.close(fig)


def test_fp8_learns_and_tracks_bf16(demo_run):
    _, _, out = demo_run
    doc, runs = _runs(out)
    uniform = doc["uniform_guess_loss"]
    for fw in ("jax", "torch"):
        f8, b16 = runs[(fw, "FP8")], runs[(fw, "bf16")]
        assert abs(f8["losses"][0] - uniform) < 0.1, fw      # starts as a uniform guess
        assert f8["losses"][-1] < f8["losses"][0] - 1.0, fw   # and learns
        assert f8["val_loss"] < uniform - 1.0, fw
        # Same weights, same batches: a broken FP8 path (wrong scale, wrong
        # transpose) is off by far more than this.
        for a, b in zip(f8["losses"], b16["losses"]):
            assert abs(a - b) < 0.03, (fw, f8["losses"], b16["losses"])
        assert abs(f8["val_loss"] - b16["val_loss"]) < 0.03
    # The two frameworks train the same model on the same batches.
    assert abs(runs[("jax", "bf16")]["val_loss"] - runs[("torch", "bf16")]["val_loss"]) < 0.03


def test_float32_seams_change_only_the_fp8_runs(demo_run, tmp_path):
    """--float32-seams has the fused layers read the float32 residual stream
    at their seams instead of the default bf16: the FP8 runs compute
    differently from the first step on, the bf16 runs do not."""
    _, _, default_out = demo_run
    out = tmp_path / "seams.png"
    with contextlib.redirect_stdout(io.StringIO()):
        assert demo.main(SMALL + ["--steps", "2", "--float32-seams", "--out", str(out)]) == 0
    doc, runs = _runs(out)
    default_doc, default = _runs(default_out)
    assert doc["recipe"] == default_doc["recipe"] + ", float32 seams"
    assert "seams" not in default_doc["recipe"]   # bf16 seams, the default, go unsaid
    for fw in ("jax", "torch"):
        # The first loss is the initial weights' on the first batch.
        assert runs[(fw, "bf16")]["losses"][0] == default[(fw, "bf16")]["losses"][0], fw
        assert runs[(fw, "FP8")]["losses"][0] != default[(fw, "FP8")]["losses"][0], fw
        assert abs(runs[(fw, "FP8")]["losses"][0] - runs[(fw, "bf16")]["losses"][0]) < 0.03


def test_bad_arguments_are_reported(capsys):
    assert demo.main(["--hidden", "50", "--steps", "1"]) == 2
    assert "hidden=50 must be a multiple of" in capsys.readouterr().err
    assert demo.main(["--batch", "0", "--steps", "1"]) == 2
    assert "batch must be an int >= 1" in capsys.readouterr().err
    assert demo.main(["--frameworks", "mxnet", "--steps", "1"]) == 2


# Two steps of a one-layer decoder in PyTorch only: a second per run.
TINY = ["--steps", "2", "--batch", "1", "--seq-len", "32", "--hidden", "64", "--layers", "1",
        "--ffn", "128", "--cpu", "--frameworks", "torch"]


def test_forward_fast_accumulation_reaches_the_recipe_and_its_name(tmp_path):
    """--forward-fast-accumulation sets the per-tensor recipes' forward GEMM
    mode (the CPU reference GEMM accumulates in float32 either way, so the
    losses say nothing here) and the recipe's name in the JSON says so."""
    from fp8kit.demo import cli
    for name in ("delayed", "current"):
        assert cli._recipe(name, True).forward_fast_accumulation is True
        assert cli._recipe(name).forward_fast_accumulation is False
    out = tmp_path / "fast.png"
    with contextlib.redirect_stdout(io.StringIO()):
        assert demo.main(TINY + ["--forward-fast-accumulation", "--out", str(out)]) == 0
    doc, _ = _runs(out)
    assert doc["recipe"] == "delayed scaling, HYBRID format, fast forward accumulation"


@pytest.mark.parametrize("out,written", [("existing", "existing/demo_loss.png"),
                                         ("new/", "new/demo_loss.png"),
                                         ("noext", "noext.png")])
def test_out_names_the_files_written(out, written, tmp_path, capsys):
    """A directory (existing, or a path ending in '/') gets demo_loss.png
    and .json inside; a name without a suffix gets .png; the printed paths
    are the files written."""
    (tmp_path / "existing").mkdir()
    assert demo.main(TINY + ["--out", str(tmp_path) + os.sep + out]) == 0
    png = (tmp_path / written).resolve()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(png.with_suffix(".json").read_text())["runs"]
    stdout = capsys.readouterr().out
    assert f"loss curves: {png}\nall losses:  {png.with_suffix('.json')}\n" in stdout


def _refused(args, capsys) -> str:
    """The one error line of a demo refused before anything is trained."""
    assert demo.main(args) == 2
    out, err = capsys.readouterr()
    assert out == "", out                    # not even the header: nothing ran
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.parametrize("args,message", [
    (["--seq-len", "100000"], "--seq-len 100000: the held-out text has"),
    (["--heads", "3"], "hidden=64 must be a multiple of heads=3"),
    (["--hidden", "72"], "hidden=72 must be a multiple of 16"),
    (["--steps", "0"], "steps must be an int >= 1"),
    (["--seed", "-1"], "--seed=-1 must be >= 0"),
    (["--log-every", "-5"], "--log-every=-5 must be >= 0"),
    (["--out", "loss.jpg"], "--out loss.jpg: the plot is written as .png, .svg, .pdf"),
    (["--recipe", "block", "--forward-fast-accumulation"],
     "--forward-fast-accumulation: block scaling's GEMMs have no fast accumulation"),
])
def test_impossible_arguments_are_one_line_before_training(args, message, capsys):
    assert message in _refused(TINY + args, capsys)


def test_unwritable_out_is_refused_before_training(tmp_path, capsys):
    (tmp_path / "a_file").write_text("")
    line = _refused(TINY + ["--out", str(tmp_path / "a_file" / "loss.png")], capsys)
    assert line == f"error: --out: {tmp_path / 'a_file'} exists and is not a directory"


@pytest.mark.parametrize("module,message", [
    ("matplotlib", "matplotlib is not installed (the demo plots the loss curves with it): "
                   "pip install 'fp8kit[bench]'"),
    ("torch", "torch is not installed (the demo trains in it): pip install 'fp8kit[torch]', "
              "or leave it out of --frameworks"),
])
def test_missing_package_is_named_before_training(module, message, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, module, None)   # as if not installed
    assert _refused(TINY, capsys) == f"error: {message}"


class _Stop(Exception):
    pass


def _stderr_before_training(args, monkeypatch, capsys) -> str:
    """What the demo says on stderr before it makes the initial weights
    (which stop it here)."""
    import fp8kit.models.init

    def stop(*_):
        raise _Stop
    monkeypatch.setattr(fp8kit.models.init, "init_params", stop)
    with pytest.raises(_Stop):
        demo.main(args)
    return capsys.readouterr().err


def test_gpu_sized_config_on_the_cpu_warns_with_an_estimate(tmp_path, monkeypatch, capsys):
    out = ["--out", str(tmp_path)]
    err = _stderr_before_training(["--config", "1b", "--cpu", "--frameworks", "torch"] + out,
                                  monkeypatch, capsys)
    assert err.startswith("warning: 2 training run(s) of a 823M-parameter model on the CPU: "
                          "about "), err
    assert " days by an estimate (not a measurement" in err
    # The demo's own run, a few minutes on 2 CPU cores, is not warned about.
    assert _stderr_before_training(["--cpu"] + out, monkeypatch, capsys) == ""


def test_config_gives_the_model_and_flags_override_its_sizes():
    from fp8kit.demo import cli
    from fp8kit.models.config import CONFIGS
    model, _ = cli._configs(cli._parser().parse_args(["--config", "1b", "--layers", "2"]))
    assert model == dataclasses.replace(CONFIGS["1b"], layers=2)
    model, _ = cli._configs(cli._parser().parse_args([]))
    assert model == CONFIGS["tiny"]


def test_learning_rate_is_the_configs_own_unless_given():
    """mixtral_slice trains at its own peak rate (the models bench's, which
    fp8kit.models.schedule documents); --lr overrides it for any config."""
    from fp8kit.demo import cli

    def lr(*argv):
        return cli._configs(cli._parser().parse_args(list(argv)))[1].lr
    assert lr() == cli.DEMO_TRAIN.lr == 3e-3
    assert lr("--config", "mixtral_slice") == 3e-4
    assert lr("--config", "mixtral_slice", "--lr", "1e-3") == 1e-3
    assert lr("--lr", "5e-4") == 5e-4


def test_module_entry_point():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, "-m", "fp8kit.demo", "--help"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--steps" in r.stdout and "--out" in r.stdout


@pytest.mark.gpu
def test_gpu_run(tmp_path):
    """Without --cpu the demo trains on the GPU in both frameworks."""
    import jax
    import torch
    if not torch.cuda.is_available() or jax.default_backend() != "gpu":
        pytest.skip("needs a CUDA GPU visible to both PyTorch and JAX")
    out = tmp_path / "loss.png"
    assert demo.main(["--steps", "100", "--out", str(out)]) == 0
    _, runs = _runs(out)
    assert runs[("torch", "FP8")]["device"].startswith("cuda")
    assert runs[("jax", "FP8")]["device"] == "gpu"
    for fw in ("jax", "torch"):
        f8, b16 = runs[(fw, "FP8")], runs[(fw, "bf16")]
        assert f8["final_loss"] < f8["losses"][0] - 1.0
        assert abs(f8["final_loss"] - b16["final_loss"]) < 0.05
        assert abs(f8["val_loss"] - b16["val_loss"]) < 0.05
