"""Copies the results of a scripts/gpu_check.sh run from its OUTDIR into
docs/results, one file per benchmark under a fixed name, each with a header
that names the run: the commit and `git describe --dirty` state of the tree,
the date, the GPU and the command.

    python3 scripts/publish_results.py OUTDIR [--dest docs/results] [--state STATE]

Only the stages this run started (OUTDIR/summary.log) are published, and
each file is written whole from them: a benchmark this run did not make
keeps its earlier file, which names its own run. A stage that failed or was
cut is published too, and its header says so. The run's facts come from
OUTDIR/run.txt; where the run's machine had no git (a copy of a working
tree) and RUN_STATE was not set, --state names the tree that ran. The
bench's plots are not published: scripts/plot_bench.py draws them from
bench.json.
"""

import argparse
import json
import pathlib
import re
import struct
import sys
import zlib

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Text files made of stage logs: name in docs/results -> the stages, in order.
LOGS = {
    "bench.txt": ("bench",),
    "kernel_profile.txt": ("kprofile",),
    "models.txt": ("models", "models_jax"),
    "models_compile.txt": ("models_compile",),
    "convergence_1b.txt": ("convergence",),
    "step_profile.txt": ("step_profile",),
    "fsdp.txt": ("fsdp",),
    "power_cap.txt": ("power_cap",),
}
# Files a stage writes into OUTDIR, copied as they are: path in OUTDIR ->
# (name in docs/results, stage). The models stages' JSON files are found by
# name (models_<config>_<framework>.json, models_1b_compile.json).
PRODUCTS = {
    "bench/bench.json": ("bench.json", "bench"),
    "bench/profile_overhead.txt": ("profile_overhead.txt", "bench"),
    "demo_loss.png": ("demo_loss.png", "demo"),
    "convergence_1b.png": ("convergence_1b.png", "convergence"),
    # The convergence run's FP8 cast statistics (the demo's, fp8kit.inspect).
    **{f"convergence_1b_fp8_{fw}.{ext}": (f"convergence_1b_fp8_{fw}.{ext}", "convergence")
       for fw in ("jax", "torch") for ext in ("jsonl", "png")},
}
# A sanitizer shard's log has a report per access the tool flags (thousands
# under initcheck); these lines are its outcome: per test file, per tool
# process, and GoogleTest's and pytest's totals.
SHARD_OUTCOME = re.compile(r"^#### |ERROR SUMMARY|^\[  (PASSED|FAILED)  \]|^CUT: |^NOT RUN: "
                           r"|^=+ .*\b(passed|failed|error|errors|skipped)\b.* =+$")
# GoogleTest's log: its totals and failures, not a line per test.
GTEST_OUTCOME = re.compile(r"^\[(==========|  PASSED  |  FAILED  )\]")


def read_run(outdir: pathlib.Path) -> dict:
    """run.txt's facts and each stage's outcome from summary.log:
    'ok (12 s)', 'FAILED (12 s)' or 'did not finish' (the run was cut).
    summary.log also holds the tail of a failed stage's log, so a line
    counts only where it names a stage with a log."""
    run = dict(line.split(": ", 1) for line in
               (outdir / "run.txt").read_text().splitlines() if ": " in line)
    stages = {}
    for line in (outdir / "summary.log").read_text().splitlines():
        started = re.match(r"== (\S+): ", line)
        ended = re.match(r"   (\S+) (ok|FAILED) \((\d+) s\)", line)
        if not (started or ended) or not (outdir / f"{(started or ended)[1]}.log").exists():
            continue
        name = (started or ended)[1]
        if started:
            stages.setdefault(name, "did not finish")
        else:
            stages[name] = f"{ended.group(2)} ({ended.group(3)} s)"
    run["stages"] = stages
    return run


def commit_of(state: str) -> str:
    """The commit in a `git describe --always --dirty` string:
    'v1.2-3-gabc1234-dirty' and 'abc1234-dirty' both give 'abc1234'."""
    state = state.removesuffix("-dirty")
    tagged = re.search(r"-g([0-9a-f]+)$", state)
    return tagged.group(1) if tagged else state


def header(run: dict, stages, ran) -> dict:
    """The fields that name the run of a file made by `stages`; `ran`:
    the commands those stages printed (gpu_check.sh's show)."""
    fields = {"commit": commit_of(run["state"]), "state": run["state"], "date": run["date"],
              "gpu": run["gpu"], "command": run["command"],
              "stages": ", ".join(f"{s} {run['stages'][s]}" for s in stages)}
    if ran:
        fields["ran"] = ran
    return fields


def header_text(fields: dict) -> str:
    lines = []
    for key, value in fields.items():
        for v in value if isinstance(value, list) else [value]:
            lines.append(f"# {key + ':':<8} {v}")
    return "\n".join(lines) + "\n"


def scrub(text: str, run: dict) -> str:
    """The run machine's paths, which say nothing about the result, as <repo> and <out>."""
    for path, name in sorted(((run["outdir"], "<out>"), (run["repo"], "<repo>")),
                             key=lambda p: -len(p[0])):
        text = text.replace(path, name)
    return text


def commands(log: str) -> list:
    return [line[2:] for line in log.splitlines() if line.startswith("$ ")]


def stamp_png(data: bytes, text: str) -> bytes:
    """The PNG with a tEXt chunk "Comment" holding `text`, before its end."""
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        raise ValueError("not a PNG")
    body = b"tEXt" + b"Comment\0" + text.encode("latin-1", "replace")
    chunk = struct.pack(">I", len(body) - 4) + body + struct.pack(">I", zlib.crc32(body))
    end = data.rindex(b"IEND") - 4   # the IEND chunk's length field
    return data[:end] + chunk + data[end:]


def stage_log(outdir: pathlib.Path, stage: str) -> str:
    """A stage's log as published: GoogleTest's totals rather than a line
    per test; for a sanitizer stage, its own log (each Python file's
    outcome) and the outcome lines of its shards' logs."""
    log = (outdir / f"{stage}.log").read_text(errors="replace")
    if stage == "cpp":
        return "\n".join(ln for ln in log.splitlines() if GTEST_OUTCOME.match(ln)) + "\n"
    if stage.startswith("sanitizer-"):
        shards = sorted(outdir.glob(f"{stage}.*.log"), key=lambda p: int(p.suffixes[-2][1:]))
        for shard in shards:
            lines = [ln for ln in shard.read_text(errors="replace").splitlines()
                     if SHARD_OUTCOME.search(ln)]
            log += f"-- {shard.name}\n" + "".join(ln + "\n" for ln in lines)
    return log


def text_files(run: dict) -> dict:
    """Name in docs/results -> the stages of this run whose logs make it."""
    ran = run["stages"]
    files = {name: [s for s in stages if s in ran] for name, stages in LOGS.items()}
    if "cpp" in ran or "pytest" in ran:
        files["gpu_tests.txt"] = [s for s in ("info", "cpp", "pytest") if s in ran]
    files["sanitizer.txt"] = sorted(s for s in ran if s.startswith("sanitizer-"))
    return {name: stages for name, stages in files.items() if stages}


def products(outdir: pathlib.Path, run: dict) -> dict:
    """Path in OUTDIR -> (name in docs/results, stage) of each file this run wrote."""
    found = dict(PRODUCTS)
    for path in outdir.glob("models_*.json"):
        stage = ("models_compile" if path.stem.endswith("_compile") else
                 "models_jax" if path.stem.endswith("_jax") else "models")
        found[path.name] = (path.name, stage)
    return {path: v for path, v in found.items()
            if v[1] in run["stages"] and (outdir / path).exists()}


def publish(outdir: pathlib.Path, dest: pathlib.Path, state: str = None) -> list:
    """Writes every file of the run into dest; returns [(name, its stages' outcomes)]."""
    run = read_run(outdir)
    run["state"] = state or run.get("state", "unknown")
    if run["state"] == "unknown":
        raise ValueError(
            f"{outdir / 'run.txt'} names no tree (its machine had no git and RUN_STATE was not "
            "set): pass --state, e.g. --state \"$(git describe --always --dirty)\" when this "
            "checkout is the tree that ran")
    logs = {s: stage_log(outdir, s) for s in run["stages"]}
    ran = {s: [scrub(c, run) for c in commands(log)] for s, log in logs.items()}
    files = {}
    for name, stages in text_files(run).items():
        body = "\n".join(f"== {s}\n{logs[s]}" for s in stages)
        fields = header(run, stages, [c for s in stages for c in ran[s]])
        files[name] = (fields, (header_text(fields) + "\n" + scrub(body, run)).encode())
    for path, (name, stage) in products(outdir, run).items():
        data = (outdir / path).read_bytes()
        # Of the stage's commands, the one that wrote this file where one names it.
        fields = header(run, [stage], [c for c in ran[stage] if name in c] or ran[stage])
        if name.endswith(".png"):
            data = stamp_png(data, header_text(fields))
        elif name.endswith(".json"):
            doc = json.loads(scrub(data.decode(), run))
            data = json.dumps({"run": fields, **doc}, indent=1).encode()
        else:
            data = (header_text(fields) + "\n" + scrub(data.decode(), run)).encode()
        files[name] = (fields, data)
    dest.mkdir(parents=True, exist_ok=True)
    for name, (fields, data) in files.items():
        (dest / name).write_bytes(data)
    return [(name, fields["stages"]) for name, (fields, _) in sorted(files.items())]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir", type=pathlib.Path, help="the OUTDIR of a scripts/gpu_check.sh run")
    ap.add_argument("--dest", type=pathlib.Path, default=ROOT / "docs" / "results")
    ap.add_argument("--state", help="the tree that ran, where run.txt has none "
                                    "(git describe --always --dirty)")
    args = ap.parse_args(argv)
    missing = [f for f in ("run.txt", "summary.log") if not (args.outdir / f).exists()]
    if missing:
        print(f"error: no {missing[0]} in {args.outdir}: not the OUTDIR of a "
              "scripts/gpu_check.sh run", file=sys.stderr)
        return 2
    try:
        written = publish(args.outdir, args.dest, args.state)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name, outcome in written:
        failed = not all(" ok (" in o for o in outcome.split(", "))
        print(f"{args.dest / name}: {outcome}" + ("  <- not every stage ok" if failed else ""))
    if not written:
        print(f"nothing to publish: no stage of this run makes a file of {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
