"""The README's results table (scripts/results_table.py) and the files it
reads: scripts/publish_results.py writes them from a scripts/gpu_check.sh
run, the table reads them, and the README holds what they give."""
import importlib.util
import json
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
RESULTS = ROOT / "docs" / "results"
BEGIN, END = "<!-- results-table:begin -->", "<!-- results-table:end -->"
RUN = {"commit": "abc1234", "state": "abc1234-dirty", "date": "2026-12-05 10:00 UTC",
       "gpu": "NVIDIA H200", "command": "scripts/gpu_check.sh"}

if not SCRIPTS.is_dir():
    pytest.skip("scripts/ is not next to the tests (a copy of tests/ alone)",
                allow_module_level=True)


def _module(name):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


table_script = _module("results_table")


def _run(script, *args):
    return subprocess.run([sys.executable, str(SCRIPTS / script), *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def _table(*args):
    return _run("results_table.py", *args)


def _bench_rows(with_te: bool):
    """A row of every group and case the table reads, ratio 1.5 against
    bf16 and 1.05 against TransformerEngine, with TE's rows or without."""
    rows = []
    for _, vs_bf16, vs_te in table_script.LAYERS:
        for (group, case), ratio in ((vs_bf16, 1.5), (vs_te, 1.05)):
            if "TransformerEngine" in group and not with_te:
                continue
            rows += [{"group": group, "case": case.format(r=r), "ratio": ratio, "error": None}
                     for r in ("delayed", "current")]
    return rows


def _models(with_te: bool):
    """What python -m fp8kit.models.bench --json writes (the fields the
    table reads); a compiled run, which the table leaves out, last."""
    runs = [{"recipe": "bf16", "tokens_per_s": 1000.0},
            {"recipe": "delayed", "tokens_per_s": 1500.0},
            {"recipe": "current", "tokens_per_s": 1400.0},
            {"recipe": "block", "error": "fp8kit's block-scaled GEMM needs sm_90"},
            {"recipe": "delayed", "mode": "compile", "tokens_per_s": 9000.0}]
    if with_te:
        runs += [{"recipe": "te-delayed", "tokens_per_s": 1250.0},
                 {"recipe": "te-current", "tokens_per_s": 1400.0}]
    else:
        runs += [{"recipe": "te-delayed", "error": "TransformerEngine is not installed"}]
    return {"config": "8b_slice", "runs": runs}


def _results(path: Path, with_te: bool = True) -> Path:
    path.mkdir(exist_ok=True)
    (path / "bench.json").write_text(json.dumps(
        {"run": RUN, "sections": ["linear", "fused"], "rows": _bench_rows(with_te)}))
    for framework in ("torch", "jax"):
        (path / f"models_8b_slice_{framework}.json").write_text(
            json.dumps({"run": RUN, **_models(with_te)}))
    return path


def _rows(out: str) -> dict:
    """{label: cells} of the printed table."""
    lines = [ln for ln in out.splitlines() if ln.startswith("| ")][1:]
    return {cells[0]: cells[1:] for cells in
            ([c.strip() for c in ln.strip("|").split("|")] for ln in lines)}


def test_every_row_against_bf16_and_te(tmp_path):
    r = _table("--results", _results(tmp_path / "results"))
    assert r.returncode == 0, r.stderr
    rows = _rows(r.stdout)
    assert len(rows) == len(table_script.LAYERS) + len(table_script.DECODERS)
    for label, _, _ in table_script.LAYERS:
        # delayed x bf16, x TE, current x bf16, x TE; no block rows in these files
        assert rows[label] == ["1.50", "1.05", "1.50", "1.05", "-", "-"], label
    for label, _ in table_script.DECODERS:
        # tokens/s over bf16's and over TE's; the block run failed: no number
        assert rows[label] == ["1.50", "1.20", "1.40", "1.00", "-", "-"], label
    assert "one run (NVIDIA H200, 2026-12-05, commit abc1234)" in r.stdout
    assert "TransformerEngine in the run" not in r.stdout


def test_without_te_rows_the_te_columns_say_so(tmp_path):
    r = _table("--results", _results(tmp_path / "results", with_te=False))
    assert r.returncode == 0, r.stderr
    for cells in _rows(r.stdout).values():
        assert cells[1] == cells[3] == "-" and cells[0] != "-", cells
    caption = r.stdout.strip().splitlines()[-1]
    for name in ("bench.json", "models_8b_slice_torch.json", "models_8b_slice_jax.json"):
        assert f"{name} (" in caption and "no TransformerEngine in the run" in caption


def test_missing_files_leave_dashes(tmp_path):
    r = _table("--results", tmp_path)
    assert r.returncode == 0, r.stderr
    assert all(set(cells) == {"-"} for cells in _rows(r.stdout).values())
    assert "bench.json (missing)" in r.stdout


def test_write_then_check(tmp_path):
    results = _results(tmp_path / "results")
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\nBefore.\n\n{BEGIN}\nold table\n{END}\n\nAfter.\n")
    r = _table("--results", results, "--write", readme)
    assert r.returncode == 0, r.stderr
    text = readme.read_text()
    printed = _table("--results", results).stdout
    assert text == f"# Title\n\nBefore.\n\n{BEGIN}\n{printed}{END}\n\nAfter.\n"
    assert _table("--results", results, "--check", readme).returncode == 0
    # Writing again changes nothing.
    assert _table("--results", results, "--write", readme).returncode == 0
    assert readme.read_text() == text
    # A README edited by hand, or files that changed, fail the check.
    readme.write_text(text.replace("1.50", "1.51", 1))
    r = _table("--results", results, "--check", readme)
    assert r.returncode == 1 and "--write" in r.stderr and "+| " in r.stderr


@pytest.mark.parametrize("text", ["no markers\n", f"{BEGIN}\nonly the first\n",
                                  f"{END}\n{BEGIN}\nin the wrong order\n"])
@pytest.mark.parametrize("mode", ["--write", "--check"])
def test_missing_markers_are_an_error(tmp_path, text, mode):
    readme = tmp_path / "README.md"
    readme.write_text(text)
    r = _table("--results", _results(tmp_path / "results"), mode, readme)
    assert r.returncode == 2 and BEGIN in r.stderr, r.stderr
    assert readme.read_text() == text


def test_the_committed_results():
    """The table from docs/results as committed: each source file names its
    run, and a run without TransformerEngine says so."""
    r = _table()
    assert r.returncode == 0, r.stderr
    assert len(_rows(r.stdout)) == len(table_script.LAYERS) + len(table_script.DECODERS)
    caption = r.stdout.strip().splitlines()[-1]
    for name in ["bench.json"] + [name for _, name in table_script.DECODERS]:
        path = RESULTS / name
        if not path.exists():
            assert f"{name} (missing)" in caption
            continue
        doc = json.loads(path.read_text())
        assert doc["run"]["commit"] in caption and doc["run"]["gpu"] in caption
        assert doc["run"]["date"][:10] in caption
        if not table_script.has_te(name, doc):
            assert f"{name} (" in caption and "no TransformerEngine in the run" in caption


def test_readme_table_is_current():
    readme = ROOT / "README.md"
    if BEGIN not in readme.read_text():
        pytest.skip(f"README.md has no {BEGIN} ... {END} lines for the table yet")
    r = _table("--check", readme)
    assert r.returncode == 0, r.stderr


def test_the_table_reads_the_rows_the_bench_writes(tmp_path):
    """Each group and case the table looks up is one the suite writes:
    fp8kit vs bf16 from a quick CPU run of the sections (other sizes, so
    the cases are compared without their shapes), fp8kit vs
    TransformerEngine (which needs a GPU) from the modules that name them."""
    fused_torch = pytest.importorskip("fp8kit.bench.fused_torch")
    from fp8kit.bench import dense_jax, linear_torch, mlp_jax
    r = subprocess.run([sys.executable, "-m", "fp8kit.bench", "--quick", "--no-plots", "--out",
                        str(tmp_path), "--sections", "linear_torch,dense_jax,fused_torch,mlp_jax"],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    shape = re.compile(r"\d+x\d+x\d+|\d+\^3")
    written = {}
    for row in json.loads((tmp_path / "bench.json").read_text())["rows"]:
        written.setdefault(row["group"], set()).add(shape.sub("SHAPE", row["case"]))
    te_fused = fused_torch._te_rows("swiglu", "x".join(map(str, fused_torch.MLP_SIZE)), 1.0, {},
                                    {"fused delayed": "", "TE delayed": ""}, {}, True)[0]
    te_cases = {
        linear_torch.group_te("fwd+bwd"): {"x".join(map(str, s)) + " delayed"
                                           for s in linear_torch.TE_SIZES},
        te_fused.group: {te_fused.case},
        dense_jax.G_TE_FWD_BWD: {f"{dense_jax.TARGET_SIZE}^3 delayed"},
        mlp_jax.G_TE: {"swiglu " + "x".join(map(str, mlp_jax.SHAPE)) + " delayed"}}
    for label, (group, case), (te_group, te_case) in table_script.LAYERS:
        assert shape.sub("SHAPE", case.format(r="delayed")) in written.get(group, ()), label
        assert te_case.format(r="delayed") in te_cases.get(te_group, ()), label


# publish_results.py: a gpu_check.sh OUTDIR in, docs/results files out.

def _png() -> bytes:
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(
            ">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0\0")) + chunk(b"IEND", b""))


def _outdir(path: Path, state="abc1234-dirty") -> Path:
    """What a gpu_check.sh run of the bench, models, demo and a sanitizer
    stage leaves (the sanitizer's failure with its log's tail in
    summary.log), the kprofile stage cut by the run's time limit, and an
    older run's step_profile log that this run did not make."""
    out = path / "out"
    (out / "bench").mkdir(parents=True)
    (out / "run.txt").write_text(
        f"state: {state}\ndate: 2026-12-05 10:00 UTC\ngpu: NVIDIA H200\n"
        "command: STAGES=\"bench models demo sanitizer kprofile\" scripts/gpu_check.sh\n"
        f"repo: /machine/checkout\noutdir: {out}\n")
    (out / "summary.log").write_text(
        "== bench: bench\n   bench ok (300 s)\n== models: models\n   models ok (200 s)\n"
        "== demo: demo\n   demo ok (20 s)\n== sanitizer-py-memcheck: sanitizer_py memcheck\n"
        "   sanitizer-py-memcheck FAILED (90 s); tail:\nshard 1 failed\n== models_jax: a log line\n"
        "== kprofile: kprofile\n")
    (out / "bench.log").write_text(
        f"$ python3 -m fp8kit.bench --full --out {out}/bench --plain-progress\ntable\n"
        f"wrote {out}/bench/bench.json\n")
    (out / "bench" / "bench.json").write_text(json.dumps(
        {"meta": {"device": "NVIDIA H200"}, "sections": ["linear", "fused"],
         "rows": _bench_rows(with_te=True)}))
    (out / "bench" / "bench_linear.png").write_bytes(_png())
    (out / "models.log").write_text("".join(
        f"$ python3 -m fp8kit.models.bench --config {c} --json {out}/models_{c}_torch.json\n"
        for c in ("1b", "8b_slice")))
    for config in ("1b", "8b_slice"):
        (out / f"models_{config}_torch.json").write_text(json.dumps(_models(True)))
    (out / "demo.log").write_text(f"$ python3 -m fp8kit.demo --out {out}/demo_loss.png\n")
    (out / "demo_loss.png").write_bytes(_png())
    (out / "sanitizer-py-memcheck.log").write_text(
        "shard 1 failed: sanitizer-py-memcheck.1.log\n#### tests/a.py rc=0\n#### tests/b.py rc=1\n")
    (out / "sanitizer-py-memcheck.0.log").write_text(
        "#### /machine/checkout/tests/a.py\n========= COMPUTE-SANITIZER\nnoise\n"
        "========= ERROR SUMMARY: 0 errors\n#### /machine/checkout/tests/a.py rc=0\n")
    (out / "sanitizer-py-memcheck.1.log").write_text(
        "#### /machine/checkout/tests/b.py\n========= Invalid __global__ read\n"
        "========= ERROR SUMMARY: 1 error\n#### /machine/checkout/tests/b.py rc=1\n")
    (out / "kprofile.log").write_text("$ python3 /machine/checkout/scripts/kernel_profile.py\n")
    (out / "step_profile.log").write_text("an earlier run's log\n")
    return out


def test_publish_writes_each_file_with_its_run(tmp_path):
    dest = tmp_path / "results"
    r = _run("publish_results.py", _outdir(tmp_path), "--dest", dest)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in dest.iterdir()) == [
        "bench.json", "bench.txt", "demo_loss.png", "kernel_profile.txt",
        "models.txt", "models_1b_torch.json", "models_8b_slice_torch.json", "sanitizer.txt"]
    assert "kernel_profile.txt: kprofile did not finish  <- not every stage ok" in r.stdout
    for path in dest.iterdir():
        data = path.read_bytes().decode("latin-1")
        for fact in ("abc1234", "abc1234-dirty", "2026-12-05 10:00 UTC", "NVIDIA H200",
                     "scripts/gpu_check.sh"):
            assert fact in data, (path.name, fact)
        assert str(tmp_path) not in data and "/machine/checkout" not in data, path.name
    bench = json.loads((dest / "bench.json").read_text())
    assert list(bench)[0] == "run" and bench["run"]["stages"] == "bench ok (300 s)"
    assert bench["run"]["ran"] == [
        "python3 -m fp8kit.bench --full --out <out>/bench --plain-progress"]
    models = json.loads((dest / "models_1b_torch.json").read_text())
    assert models["run"]["ran"] == [
        "python3 -m fp8kit.models.bench --config 1b --json <out>/models_1b_torch.json"]
    text = (dest / "bench.txt").read_text()
    assert text.startswith("# commit:  abc1234\n") and "wrote <out>/bench/bench.json" in text
    sanitizer = (dest / "sanitizer.txt").read_text()
    assert "sanitizer-py-memcheck FAILED (90 s)" in sanitizer
    assert "ERROR SUMMARY: 1 error" in sanitizer and "noise" not in sanitizer
    assert "#### <repo>/tests/b.py rc=1" in sanitizer
    png = (dest / "demo_loss.png").read_bytes()
    assert png.endswith(_png()[-12:]) and b"tEXtComment\0# commit:  abc1234" in png
    # The table reads what was published.
    r = _table("--results", dest)
    assert r.returncode == 0, r.stderr
    assert _rows(r.stdout)["PyTorch decoder 8b_slice, tokens/s"][:2] == ["1.50", "1.20"]


def test_publish_needs_the_tree_that_ran(tmp_path):
    out = _outdir(tmp_path, state="unknown")
    dest = tmp_path / "results"
    r = _run("publish_results.py", out, "--dest", dest)
    assert r.returncode == 2 and "--state" in r.stderr and not dest.exists()
    r = _run("publish_results.py", out, "--dest", dest, "--state", "v1.0-3-gfedcba9")
    assert r.returncode == 0, r.stderr
    assert json.loads((dest / "bench.json").read_text())["run"]["commit"] == "fedcba9"


def test_publish_refuses_a_folder_that_is_no_run(tmp_path):
    r = _run("publish_results.py", tmp_path, "--dest", tmp_path / "results")
    assert r.returncode == 2 and "run.txt" in r.stderr
