"""Draws the bench's plots from a bench.json: one PNG per section, as
python -m fp8kit.bench draws them after a run. docs/results keeps the JSON
and not the plots, which this redraws on demand.

    python scripts/plot_bench.py [BENCH_JSON] [--out DIR]
    (default: docs/results/bench.json into out/plots)
"""

import argparse
import dataclasses
import json
import pathlib
import sys

from fp8kit.bench import plots
from fp8kit.bench.results import Row

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIELDS = {f.name for f in dataclasses.fields(Row)}   # the JSON adds derived ones (ratio, ...)


def title_note(doc: dict) -> str:
    """What the suite puts in each plot's title: the run, or that it makes no claims."""
    if doc.get("note"):
        return doc["note"].split(":")[0] + ": not performance claims"
    run, meta = doc.get("run", {}), doc["meta"]
    commit = run.get("commit") or (meta.get("commit") or "")[:7]
    return f"{meta.get('device')}, {meta['time']}" + (f", commit {commit}" if commit else "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bench_json", nargs="?", type=pathlib.Path,
                    default=ROOT / "docs" / "results" / "bench.json")
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out", "plots"))
    args = ap.parse_args(argv)
    doc = json.loads(args.bench_json.read_text())
    rows = [Row(**{k: v for k, v in r.items() if k in FIELDS}) for r in doc["rows"]]
    for path in plots.plot_all(rows, args.out, title_note(doc)):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
