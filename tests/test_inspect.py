"""fp8kit.inspect on crafted records: the JSON lines file (non-finite
numbers, null, append and resume), StatsLog's arguments, the reader's
errors, the summary's ranking, the plot and the TensorBoard scalars, and
the command line's one-line errors. No framework and no device."""

import ast
import json
import math
import pathlib
import runpy
import sys
import types

import numpy as np
import pytest

import fp8kit.inspect as fi
from fp8kit.inspect import cli, writer
from fp8kit.inspect.history import histories, ranked

try:
    import matplotlib  # noqa: F401
    HAS_MATPLOTLIB = True
except ImportError:
    HAS_MATPLOTLIB = False


def _ts(layer, role="input", amax=1.0, scale=448.0, numel=1000, underflow=0, saturated=0,
        error_sq=1e-4, norm_sq=1.0):
    return fi.TensorStats(layer, role, amax, scale, numel, underflow, saturated, error_sq,
                          norm_sq)


def _strict_json(line):
    """json.loads that fails on NaN / Infinity, which are not JSON."""
    def refuse(constant):
        raise AssertionError(f"{constant} written into the JSON")
    return json.loads(line, parse_constant=refuse)


def _write(path, steps, make, framework="torch", recipe="DelayedScaling", **kw):
    with fi.StatsLog(path, every=1, **kw) as log:
        for step in steps:
            log.write(step, framework, recipe, make(step))
    return path


def _crafted_run(path):
    """Four tensors whose ranking is known: saturation a > b (c, d never),
    underflow c > d (a, b never), relative error d > c > b > a; b's
    saturation peaks at step 20."""
    def make(step):
        return [_ts("a", "grad_output", saturated=30, error_sq=1e-6),
                _ts("b", "grad_output", saturated=50 if step == 20 else 5, error_sq=4e-6),
                _ts("c", "input", underflow=200, error_sq=9e-6),
                _ts("d", "input", underflow=100 if step == 10 else 1, error_sq=16e-6)]
    return _write(path, [0, 10, 20, 30], make)


# ------------------------------------------------------------ the file ---

def test_round_trip_keeps_non_finite_numbers_and_null(tmp_path):
    path = tmp_path / "run.jsonl"
    tensors = [_ts("l0", "input", amax=math.nan, scale=None),
               _ts("l0", "weight", amax=math.inf, error_sq=math.inf),
               _ts("l0", "grad_output", amax=0.0, norm_sq=0.0, numel=0),
               _ts("l1", "input", amax=np.float32(2.5), underflow=np.int64(7), scale=-math.inf)]
    with fi.StatsLog(path, every=5) as log:
        written = log.write(10, "jax", "CurrentScaling", tensors)
    lines = path.read_text().splitlines()
    assert len(lines) == 1
    raw = _strict_json(lines[0])["tensors"]
    assert raw["l0/input"]["amax"] == "nan" and raw["l0/input"]["scale"] is None
    assert raw["l0/weight"]["relative_error"] == "inf" and raw["l1/input"]["scale"] == "-inf"
    [record] = fi.read_run(path)
    assert record["step"] == 10 and record["framework"] == "jax"
    assert record["recipe"] == "CurrentScaling"
    got = record["tensors"]
    assert math.isnan(got["l0/input"]["amax"]) and got["l0/input"]["scale"] is None
    assert got["l0/weight"]["amax"] == math.inf and got["l0/weight"]["relative_error"] == math.inf
    assert got["l0/grad_output"]["relative_error"] is None  # no signal
    assert got["l0/grad_output"]["underflow_rate"] == 0.0  # numel 0
    assert got["l1/input"]["amax"] == 2.5 and got["l1/input"]["underflow"] == 7
    assert got["l1/input"]["scale"] == -math.inf
    assert got["l1/input"]["underflow_rate"] == 7 / 1000
    assert got["l0/input"]["relative_error"] == pytest.approx(0.01)
    assert list(got) == list(written["tensors"])  # the collectors' order


def test_a_published_files_header_lines_are_skipped(tmp_path):
    """scripts/publish_results.py puts '# key: value' lines naming the run
    on top of a published file; the records below still read."""
    path = tmp_path / "run.jsonl"
    with fi.StatsLog(path, every=1) as log:
        log.write(0, "torch", "DelayedScaling", [_ts("l")])
    path.write_text("# commit:  abc1234\n# gpu:     NVIDIA H200\n" + path.read_text())
    assert [r["step"] for r in fi.read_run(path)] == [0]


def test_every_line_is_flushed_before_close(tmp_path):
    path = tmp_path / "crashed.jsonl"
    log = fi.StatsLog(path, every=1)
    log.write(0, "torch", "DelayedScaling", [_ts("l")])
    log.write(1, "torch", "DelayedScaling", [_ts("l")])
    assert [r["step"] for r in fi.read_run(path)] == [0, 1]  # not closed: a crash here
    log.close()
    log.close()
    with pytest.raises(ValueError, match="closed"):
        log.write(2, "torch", "DelayedScaling", [_ts("l")])


def test_new_log_replaces_the_file_and_append_continues_it(tmp_path):
    path = tmp_path / "sub" / "run.jsonl"  # the directory is created
    _write(path, [0, 10, 20], lambda s: [_ts("l", amax=1.0)])
    _write(path, [0, 10], lambda s: [_ts("l", amax=2.0)])
    assert [r["step"] for r in fi.read_run(path)] == [0, 10]
    # A run resumed from its step-10 checkpoint logs 10 again: the later line wins.
    _write(path, [10, 20], lambda s: [_ts("l", amax=3.0)], append=True)
    assert [r["step"] for r in fi.read_run(path)] == [0, 10, 10, 20]
    [h] = histories(fi.read_run(path))
    assert h.steps == [0, 10, 20] and h.values["amax"] == [2.0, 3.0, 3.0]


@pytest.mark.parametrize("every", [0, -1, True, 2.5, "3", None])
def test_every_must_be_a_positive_int(every, tmp_path):
    with pytest.raises(ValueError, match=r"every=.*expected an int >= 1"):
        fi.StatsLog(tmp_path / "run.jsonl", every=every)
    assert not (tmp_path / "run.jsonl").exists()


def test_should_log_the_multiples_of_every_from_step_0(tmp_path):
    with fi.StatsLog(tmp_path / "run.jsonl", every=np.int64(3)) as log:
        assert log.every == 3
        assert [s for s in range(10) if log.should_log(s)] == [0, 3, 6, 9]
        for bad in (-1, True, 1.0):
            with pytest.raises(ValueError, match="step="):
                log.should_log(bad)
    with fi.StatsLog(tmp_path / "run.jsonl", every=1) as log:
        assert all(log.should_log(s) for s in range(5))


def test_write_rejects_what_is_no_record(tmp_path):
    with fi.StatsLog(tmp_path / "run.jsonl", every=1) as log:
        with pytest.raises(ValueError, match="not a TensorStats"):
            log.write(0, "torch", "DelayedScaling", [{"layer": "l"}])
        with pytest.raises(ValueError, match=r"named twice: \['l/input'\]"):
            log.write(0, "torch", "DelayedScaling", [_ts("l"), _ts("l")])
        for step in (-1, True, 2.0):
            with pytest.raises(ValueError, match=r"StatsLog.write: step="):
                log.write(step, "torch", "DelayedScaling", [_ts("l")])
    with pytest.raises(ValueError, match="role 'bias'"):
        _ts("l", "bias")
    assert fi.read_run(tmp_path / "run.jsonl") == []


@pytest.mark.parametrize("line,message", [
    ('{"step": 1, "framework": "torch"', "not JSON"),
    ('[1, 2]', "a JSON list, not an object"),
    ('{"framework": "torch", "recipe": "r", "tensors": {}}', "no 'step'"),
    ('{"step": "1", "framework": "torch", "recipe": "r", "tensors": {}}',
     "'step' is '1', not a JSON integer"),
    ('{"step": true, "framework": "torch", "recipe": "r", "tensors": {}}', "'step' is True"),
    ('{"step": 1, "framework": "torch", "recipe": "r", "tensors": []}', "'tensors' is"),
    ('{"step": 1, "framework": "torch", "recipe": "r", "tensors": {"l/input": 3}}',
     "tensor 'l/input': 3 is not an object"),
    ('{"step": 1, "framework": "torch", "recipe": "r", "tensors": {"l/input": {"amax": "big"}}}',
     "tensor 'l/input': 'amax' is 'big', not a number"),
])
def test_malformed_line_is_named_by_file_and_line(line, message, tmp_path):
    path = tmp_path / "run.jsonl"
    good = fi.encode_line(fi.step_record(0, "torch", "r", [_ts("l")]))
    path.write_text(good + "\n\n" + line + "\n" + good + "\n")
    with pytest.raises(ValueError) as e:
        fi.read_run(path)
    assert str(e.value).startswith(f"{path}:3: not a step record: ")
    assert message in str(e.value)
    assert "unfinished" not in str(e.value)


def test_unfinished_last_line_says_so(tmp_path):
    path = tmp_path / "run.jsonl"
    good = fi.encode_line(fi.step_record(0, "torch", "r", [_ts("l")]))
    path.write_text(good + "\n" + good[:40])
    with pytest.raises(ValueError, match=r"run.jsonl:2: .*unfinished"):
        fi.read_run(path)


# -------------------------------------------------------------- summary ---

def test_summary_ranks_the_crafted_tensors(tmp_path):
    hists = histories(fi.read_run(_crafted_run(tmp_path / "run.jsonl")))
    sat = ranked(hists, "saturation_rate", 5, nonzero_only=True)
    assert [h.name for h, *_ in sat] == ["a/grad_output", "b/grad_output"]
    (_, mean_a, _, _), (_, mean_b, peak_b, step_b) = sat
    assert mean_a == pytest.approx(0.03) and mean_b == pytest.approx(0.01625)
    assert (peak_b, step_b) == (pytest.approx(0.05), 20)
    under = ranked(hists, "underflow_rate", 5, nonzero_only=True)
    assert [(h.name, step) for h, _, _, step in under] == [("c/input", 0), ("d/input", 10)]
    err = ranked(hists, "relative_error", 2)
    assert [h.name for h, *_ in err] == ["d/input", "c/input"]
    assert err[0][1] == pytest.approx(4e-3)


def test_summary_command_prints_the_tables(tmp_path, capsys):
    path = _crafted_run(tmp_path / "run.jsonl")
    assert cli.main(["summary", str(path), "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("run.jsonl: torch, DelayedScaling; 4 logged steps (0..30), 4 tensors")
    assert "highest mean saturation rate (2 of 4 tensors saturate at some logged step)" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("  ") and
            "tensor" not in line]
    assert rows == [["a/grad_output", "0.03", "0.03", "0"], ["c/input", "0.2", "0.2", "0"],
                    ["d/input", "0.004", "0.004", "0"]]


def test_summary_puts_nan_first_and_lists_non_finite_amax(tmp_path, capsys):
    path = _write(tmp_path / "run.jsonl", [0, 1], lambda s: [
        _ts("x", amax=math.nan if s == 1 else 1.0, error_sq=math.nan if s == 1 else 0.0),
        _ts("y", error_sq=0.5)])
    err = ranked(histories(fi.read_run(path)), "relative_error", 2)
    assert [h.name for h, *_ in err] == ["x/input", "y/input"] and math.isnan(err[0][1])
    assert cli.main(["summary", str(path)]) == 0
    out = capsys.readouterr().out
    assert "no cast did (saturation_rate 0 throughout)" in out
    assert "non-finite amax: a NaN or inf in the tensor (1 tensor)" in out
    assert out.splitlines()[-1].split() == ["x/input", "1", "1"]


def test_a_file_of_two_runs_keeps_them_apart(tmp_path, capsys):
    path = tmp_path / "both.jsonl"
    _write(path, [0, 10], lambda s: [_ts("l", saturated=10)], framework="torch")
    _write(path, [0, 10], lambda s: [_ts("l", saturated=20)], framework="jax", append=True)
    hists = histories(fi.read_run(path))
    assert [h.label for h in hists] == ["torch DelayedScaling: l/input",
                                        "jax DelayedScaling: l/input"]
    assert cli.main(["summary", str(path)]) == 0
    out = capsys.readouterr().out
    assert "2 runs (torch, DelayedScaling; jax, DelayedScaling)" in out
    assert out.index("jax DelayedScaling: l/input") < out.index("torch DelayedScaling: l/input")


# ----------------------------------------------------------------- plot ---

@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is not installed")
def test_plot_writes_a_png(tmp_path, capsys):
    path = _crafted_run(tmp_path / "run.jsonl")
    assert cli.main(["plot", str(path)]) == 0
    png = tmp_path / "run.png"
    assert capsys.readouterr().out.strip() == f"wrote {png}"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out_dir = tmp_path / "plots"
    out_dir.mkdir()
    assert cli.main(["plot", str(path), "--out", str(out_dir), "--tensors", "a/grad_output",
                     "^[cd]/", "--metric", "relative_error", "amax"]) == 0
    assert (out_dir / "run.png").stat().st_size > 1000


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is not installed")
def test_plot_draws_zeros_nan_block_scaling_and_two_runs(tmp_path):
    path = tmp_path / "odd.jsonl"
    _write(path, [0, 1, 2], lambda s: [_ts("z"), _ts("n", amax=math.nan, scale=None)])
    _write(path, [1, 3], lambda s: [_ts("z", underflow=3)], framework="jax", append=True)
    out = fi.plot_run(fi.read_run(path), tmp_path / "odd.png", tensors=["n/input"])
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_unknown_tensors_are_rejected_with_known_names(tmp_path, capsys):
    path = _crafted_run(tmp_path / "run.jsonl")
    assert cli.main(["plot", str(path), "--tensors", "a/grad_output", "e/weight"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("error: --tensors: 'e/weight' names no tensor of the file; known: "
                          "a/grad_output, b/grad_output, c/input, d/input")
    assert cli.main(["plot", str(path), "--tensors", "(unclosed"]) == 2
    assert "no tensor name and no regular expression" in capsys.readouterr().err
    assert not (tmp_path / "run.png").exists()


def test_missing_matplotlib_is_one_line(tmp_path, capsys, monkeypatch):
    path = _crafted_run(tmp_path / "run.jsonl")
    for module in [m for m in sys.modules if m.split(".")[0] == "matplotlib"]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    assert cli.main(["plot", str(path)]) == 2
    assert capsys.readouterr().err == ("error: matplotlib is not installed (the plot draws "
                                       "with it): pip install matplotlib\n")


# ---------------------------------------------------------- command line ---

def test_command_line_errors_are_one_line_and_exit_2(tmp_path, capsys):
    missing = tmp_path / "missing.jsonl"
    assert cli.main(["summary", str(missing)]) == 2
    assert capsys.readouterr().err == f"error: {missing}: cannot read it: No such file or " \
                                      "directory\n"
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert cli.main(["plot", str(empty)]) == 2
    assert capsys.readouterr().err == f"error: {empty}: no logged steps in it\n"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{}\n")
    assert cli.main(["summary", str(bad)]) == 2
    assert capsys.readouterr().err == f"error: {bad}:1: not a step record: no 'step'\n"
    good = _crafted_run(tmp_path / "run.jsonl")
    assert cli.main(["summary", str(good), "--top", "0"]) == 2
    assert capsys.readouterr().err == "error: --top=0 must be >= 1\n"
    assert cli.main(["plot", str(good), "--out", str(good)]) == 2
    assert capsys.readouterr().err == f"error: --out: {good} is the run's file itself\n"
    assert fi.read_run(good)
    with pytest.raises(SystemExit) as e:
        cli.main(["plot", str(good), "--metric", "loss"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        cli.main([])
    assert e.value.code == 2


def test_python_dash_m_runs_the_command_line(tmp_path, capsys, monkeypatch):
    path = _crafted_run(tmp_path / "run.jsonl")
    monkeypatch.setattr(sys, "argv", ["fp8kit.inspect", "summary", str(path)])
    with pytest.raises(SystemExit) as e:
        runpy.run_module("fp8kit.inspect", run_name="__main__")
    assert e.value.code == 0
    assert "highest mean underflow rate" in capsys.readouterr().out


# ---------------------------------------------------------- TensorBoard ---

class _RecordingWriter:
    made = []

    def __init__(self, logdir):
        self.logdir, self.scalars, self.flushes, self.closed = logdir, [], 0, False
        _RecordingWriter.made.append(self)

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))

    def flush(self):
        self.flushes += 1

    def close(self):
        self.closed = True


def test_tensorboard_scalars_are_written_per_tensor_role_and_metric(tmp_path, monkeypatch):
    module = types.ModuleType("fake_summary_writer")
    module.Writer = _RecordingWriter
    monkeypatch.setitem(sys.modules, "fake_summary_writer", module)
    monkeypatch.setattr(writer, "TENSORBOARD_WRITERS", (("fp8kit_no_such_module", "Writer"),
                                                        ("fake_summary_writer", "Writer")))
    _RecordingWriter.made.clear()
    with fi.StatsLog(tmp_path / "run.jsonl", every=10, tensorboard=tmp_path / "tb") as log:
        log.write(20, "torch", "DelayedScaling",
                  [_ts("layers.0.fc1", "weight", amax=2.0, scale=None, saturated=10),
                   _ts("layers.0.fc1", "grad_output", amax=math.inf, norm_sq=0.0)])
    [tb] = _RecordingWriter.made
    assert tb.logdir == str(tmp_path / "tb") and tb.closed and tb.flushes == 1
    got = {tag: (value, step) for tag, value, step in tb.scalars}
    assert got == {"layers.0.fc1/weight/amax": (2.0, 20),
                   "layers.0.fc1/weight/underflow_rate": (0.0, 20),
                   "layers.0.fc1/weight/saturation_rate": (0.01, 20),
                   "layers.0.fc1/weight/relative_error": (pytest.approx(0.01), 20),
                   "layers.0.fc1/grad_output/amax": (math.inf, 20),
                   "layers.0.fc1/grad_output/scale": (448.0, 20),
                   "layers.0.fc1/grad_output/underflow_rate": (0.0, 20),
                   "layers.0.fc1/grad_output/saturation_rate": (0.0, 20)}


def test_tensorboard_without_a_writer_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(writer, "TENSORBOARD_WRITERS", (("fp8kit_no_such_module", "Writer"),))
    with pytest.raises(ImportError, match=r"pip install tensorboard \(or tensorboardX\)"):
        fi.StatsLog(tmp_path / "run.jsonl", every=1, tensorboard=tmp_path / "tb")
    assert not (tmp_path / "run.jsonl").exists()


def test_tensorboard_with_the_installed_writer(tmp_path):
    try:
        writer.summary_writer_class()
    except ImportError as e:
        assert "pip install tensorboard" in str(e)
        pytest.skip("no TensorBoard summary writer is installed")
    with fi.StatsLog(tmp_path / "run.jsonl", every=1, tensorboard=tmp_path / "tb") as log:
        log.write(3, "jax", "DelayedScaling", [_ts("dense", "input", saturated=250)])
    assert list((tmp_path / "tb").rglob("*tfevents*"))
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        from tensorboard.util.tensor_util import make_ndarray
    except ImportError:
        return  # tensorboardX alone writes the events but cannot read them back
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tag = "dense/input/saturation_rate"
    # tensorboard's own writer stores scalars as tensor events, tensorboardX as scalar ones.
    if tag in events.Tags()["tensors"]:
        [event] = events.Tensors(tag)
        value = float(make_ndarray(event.tensor_proto))
    else:
        [event] = events.Scalars(tag)
        value = event.value
    assert event.step == 3 and value == pytest.approx(0.25)


# ------------------------------------------------------------- framework-free ---

def test_the_package_imports_no_framework():
    root = pathlib.Path(fi.__file__).parent
    found = []
    for path in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.name}: {n}" for n in names
                      if n.split(".")[0] in ("torch", "jax", "jaxlib", "flax")]
    assert not found
