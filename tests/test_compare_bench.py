"""scripts/compare_bench.py: a row is slower only when its fp8kit time grew
beyond its anchor's drift plus the noise band, for the bench's rows and
the decoder bench's; runs on different GPUs and mixed kinds are refused."""
import copy
import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "compare_bench.py"

if not SCRIPT.is_file():
    pytest.skip("scripts/ is not next to the tests (a copy of tests/ alone)",
                allow_module_level=True)

spec = importlib.util.spec_from_file_location("compare_bench", SCRIPT)
compare_bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare_bench)


def _row(case, fp8kit_s, anchor_s, error=None):
    return {"section": "linear", "group": "Linear fwd+bwd", "case": case, "fp8kit_s": fp8kit_s,
            "anchor_s": anchor_s, "error": error}


BENCH = {"meta": {"device": "NVIDIA H200"},
         "rows": [_row("a", 1.0, 2.0), _row("b", 1.0, 2.0), _row("c", 1.0, 2.0),
                  _row("gone", 1.0, 2.0), _row("failed", None, 2.0, "boom")]}


def _write(tmp_path, name, run):
    path = tmp_path / name
    path.write_text(json.dumps(run))
    return str(path)


def test_an_unchanged_run_has_no_slower_row(tmp_path, capsys):
    old = _write(tmp_path, "old.json", BENCH)
    assert compare_bench.main([old, old]) == 0
    out = capsys.readouterr().out
    assert "4 rows compared, 0 slower" in out


def test_slower_faster_and_drift(tmp_path, capsys):
    new = copy.deepcopy(BENCH)
    rows = {r["case"]: r for r in new["rows"]}
    rows["a"]["fp8kit_s"] = 1.10                           # 10% slower, anchor unchanged
    rows["b"]["fp8kit_s"], rows["b"]["anchor_s"] = 1.10, 2.2  # the machine drifted
    rows["c"]["fp8kit_s"] = 0.9                            # faster
    new["rows"].remove(rows["gone"])
    new["rows"].append(_row("added", 1.0, 2.0))
    code = compare_bench.main([_write(tmp_path, "old.json", BENCH),
                               _write(tmp_path, "new.json", new)])
    out = capsys.readouterr().out
    verdicts = {line.split(" / ")[2].split()[0]: line.split()[-1] for line in out.splitlines()
                if line.startswith("linear / ")}
    assert verdicts == {"a": "SLOWER", "b": "same", "c": "faster"}
    assert code == 1
    assert "linear / Linear fwd+bwd / added" in out and "linear / Linear fwd+bwd / gone" in out


def test_the_decoder_bench_compares_tokens_per_second(tmp_path, capsys):
    def runs(delayed):
        return {"run": {"gpu": "NVIDIA H200"}, "config": "8b_slice", "runs": [
            {"framework": "torch", "recipe": "bf16", "mode": "eager", "tokens_per_s": 100.0},
            {"framework": "torch", "recipe": "delayed", "mode": "eager",
             "tokens_per_s": delayed}]}
    old = _write(tmp_path, "old.json", runs(140.0))
    assert compare_bench.main([old, _write(tmp_path, "same.json", runs(139.0))]) == 0
    assert compare_bench.main([old, _write(tmp_path, "slow.json", runs(120.0))]) == 1
    assert "models / 8b_slice / torch delayed eager" in capsys.readouterr().out


def test_bad_inputs_are_refused(tmp_path, capsys):
    old = _write(tmp_path, "old.json", BENCH)
    other = copy.deepcopy(BENCH)
    other["meta"]["device"] = "NVIDIA H100 80GB HBM3"
    assert compare_bench.main([old, _write(tmp_path, "h100.json", other)]) == 2
    assert "different GPUs" in capsys.readouterr().err
    models = _write(tmp_path, "m.json", {"run": {"gpu": "NVIDIA H200"}, "runs": []})
    assert compare_bench.main([old, models]) == 2
    with pytest.raises(SystemExit, match="missing.json"):
        compare_bench.main([old, str(tmp_path / "missing.json")])


def test_several_pairs_count_a_row_slower_only_when_slower_in_each(tmp_path, capsys):
    def run(a, b):
        new = copy.deepcopy(BENCH)
        rows = {r["case"]: r for r in new["rows"]}
        rows["a"]["fp8kit_s"], rows["b"]["fp8kit_s"] = a, b
        return new
    old = _write(tmp_path, "old.json", BENCH)
    pair1 = _write(tmp_path, "new1.json", run(1.10, 1.10))  # a and b slower
    pair2 = _write(tmp_path, "new2.json", run(1.10, 1.00))  # a slower, b the same
    assert compare_bench.main([old, pair1, old, pair2]) == 1
    out = capsys.readouterr().out
    verdicts = {line.split(" / ")[2].split()[0]: line.split()[-1] for line in out.splitlines()
                if line.startswith("linear / ")}
    assert verdicts == {"a": "SLOWER", "b": "same", "c": "same", "gone": "same"}
    assert "4 rows compared, 1 slower in all 2 pairs" in out
    assert compare_bench.main([old, pair2, old, pair1, old]) == 2
    assert "pass the runs in pairs" in capsys.readouterr().err
