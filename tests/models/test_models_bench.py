"""python -m fp8kit.models.bench on the CPU with the tiny config: every
(framework, recipe) run trains, in its own process, and reports."""

import importlib.util
import json

import pytest

from fp8kit.models import bench

SMOKE = ["--config", "tiny", "--layers", "1", "--seq-len", "32", "--batch", "2", "--warmup",
         "1", "--steps", "2"]


def test_smoke_run_reports_every_framework_and_recipe(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert bench.main(SMOKE + ["--json", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert "2 x seq 32 = 64 tokens/step" in stdout
    doc = json.loads(out.read_text())
    runs = {(r["framework"], r["recipe"]): r for r in doc["runs"]}
    assert set(runs) == {(f, r) for f in bench.FRAMEWORKS for r in bench.RECIPES}
    for r in runs.values():
        assert r["tokens_per_s"] > 0 and r["step_ms"] > 0
        assert 3.0 < r["last_loss"] < 6.0             # trained from ln(256) = 5.5
        assert r["peak_memory_bytes"] is None          # no device allocator on a CPU
        assert f"{r['framework']:<9} {r['recipe']:<10}" in stdout
    assert doc["model"]["layers"] == 1 and doc["model"]["hidden"] == 128


@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is not None,
                    reason="TransformerEngine is installed: its rows would run")
def test_transformer_engine_rows_say_why_they_did_not_run(capsys):
    """The TE peer recipes are optional: without TransformerEngine each one
    reports why in the table (the other runs go on); JAX has no TE row."""
    assert bench.main(SMOKE + ["--recipes", "bf16,te-current"]) == 0
    out = capsys.readouterr().out
    assert "torch     te-current not run: TransformerEngine (PyTorch) not available" in out
    assert "jax       te-current" not in out
    assert out.count("  1.00 ") == 2   # each framework's bf16 against itself


@pytest.mark.parametrize("args,message", [
    (["--recipes", "fp4"], "--recipes: unknown ['fp4']"),
    (["--frameworks", "mxnet"], "--frameworks: unknown ['mxnet']"),
    (["--steps", "0"], "--steps=0 is too small"),
    (["--config", "tiny", "--seq-len", "0"], "seq_len must be an int >= 1"),
])
def test_bad_arguments_are_reported(args, message, capsys):
    assert bench.main(args) == 2
    assert message in capsys.readouterr().err
