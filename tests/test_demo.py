"""python -m fp8kit.demo on the CPU, small: it trains in FP8 and bf16 in
both frameworks, prints the loss table, writes the PNG and the JSON, and
the FP8 runs learn about as well as the bf16 runs."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("jax")
pytest.importorskip("torch")
pytest.importorskip("matplotlib")

from fp8kit import demo  # noqa: E402

# Small enough for 2 CPU cores in well under a minute; the default run is larger.
SMALL = ["--steps", "30", "--batch", "64", "--hidden", "64", "--blocks", "1", "--cpu"]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "loss.png"
    import contextlib
    import io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = demo.main(SMALL + ["--out", str(out)])
    return rc, buf.getvalue(), out


def test_runs_and_prints_the_table(demo_run):
    rc, stdout, out = demo_run
    assert rc == 0, stdout
    assert "FP8 train" in stdout and "bf16 train" in stdout
    # Progress lines for every run, one table row per framework.
    for label in ("jax fp8", "jax bf16", "torch fp8", "torch bf16"):
        assert f"[{label}" in stdout
    table_rows = [ln for ln in stdout.splitlines() if ln.startswith(("jax ", "torch "))
                  and "|" in ln]
    assert len(table_rows) == 2, stdout
    assert "text sampled from the FP8 jax model" in stdout
    assert str(out.resolve()) in stdout


def test_writes_png_and_json(demo_run):
    _, _, out = demo_run
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 10_000
    doc = json.loads(out.with_suffix(".json").read_text())
    runs = {(r["framework"], r["precision"]): r for r in doc["runs"]}
    assert set(runs) == {("jax", "fp8"), ("jax", "bf16"), ("torch", "fp8"), ("torch", "bf16")}
    for r in runs.values():
        assert len(r["losses"]) == 30
        assert r["device"] == "cpu"


def test_fp8_learns_and_tracks_bf16(demo_run):
    _, _, out = demo_run
    doc = json.loads(out.with_suffix(".json").read_text())
    runs = {(r["framework"], r["precision"]): r for r in doc["runs"]}
    uniform = doc["uniform_guess_loss"]
    for fw in ("jax", "torch"):
        f8, b16 = runs[(fw, "fp8")], runs[(fw, "bf16")]
        first = f8["losses"][0]
        assert abs(first - uniform) < 0.5, (fw, first, uniform)  # starts near a uniform guess
        # Clearly learned: the last steps are well below the start.
        assert f8["final_loss"] < first - 0.4, (fw, f8["final_loss"], first)
        assert f8["val_loss"] < uniform - 0.4
        # FP8 tracks bf16 (same weights, same batches): a broken FP8 path
        # (wrong scale, wrong transpose) is off by far more than this.
        assert abs(f8["final_loss"] - b16["final_loss"]) < 0.1, (fw, f8["final_loss"],
                                                                  b16["final_loss"])
        assert abs(f8["val_loss"] - b16["val_loss"]) < 0.1
        # Same start: the runs share initial weights and batches.
        assert abs(f8["losses"][0] - b16["losses"][0]) < 0.05


def test_bad_arguments_are_reported(capsys):
    assert demo.main(["--hidden", "50", "--steps", "1"]) == 2
    assert "hidden=50 must be a positive multiple of 16" in capsys.readouterr().err
    assert demo.main(["--batch", "0", "--steps", "1"]) == 2
    assert "batch=0 must be >= 1" in capsys.readouterr().err
    assert demo.main(["--frameworks", "mxnet", "--steps", "1"]) == 2


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
    rc = demo.main(["--steps", "40", "--out", str(out), "--no-sample"])
    assert rc == 0
    doc = json.loads(out.with_suffix(".json").read_text())
    runs = {(r["framework"], r["precision"]): r for r in doc["runs"]}
    assert runs[("torch", "fp8")]["device"].startswith("cuda")
    assert runs[("jax", "fp8")]["device"] == "gpu"
    for fw in ("jax", "torch"):
        f8, b16 = runs[(fw, "fp8")], runs[(fw, "bf16")]
        assert f8["final_loss"] < f8["losses"][0] - 0.4
        assert abs(f8["final_loss"] - b16["final_loss"]) < 0.1
        assert abs(f8["val_loss"] - b16["val_loss"]) < 0.1
