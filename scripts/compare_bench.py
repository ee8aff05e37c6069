"""Did a change make any benchmark row slower? Compares two runs of the
bench (bench.json) or of the decoder bench (models_<config>_<framework>.json),
row by row, beside the drift of what the change did not touch.

    python scripts/compare_bench.py OLD.json NEW.json [--noise 0.03]

A bench row is matched by (section, group, case). Its fp8kit time is
compared, NEW against OLD, and so is its anchor's (bf16, TransformerEngine,
torchao: code the change did not touch), whose drift is what the machine
alone did between the two runs. A row is slower when its fp8kit time grew
by more than `--noise` beyond its own anchor's drift; a decoder row
(framework, recipe, mode) compares tokens/s beside the bf16 row of the
same framework. Rows in one run only, and rows that failed, are listed
apart. Runs on different GPUs are refused: their times do not compare.

Exit status: 0 when no row is slower, 1 when one is, 2 for a bad input.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys


def _load(path: str) -> dict:
    try:
        return json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: {path}: {e}") from None


def _gpu(run: dict) -> str | None:
    if "rows" in run:
        return (run.get("meta") or {}).get("device")
    return (run.get("run") or {}).get("gpu")


def bench_rows(run: dict) -> dict:
    """{(section, group, case): (fp8kit seconds, anchor seconds)} of the
    rows that ran (None for a time the row has not)."""
    out = {}
    for r in run["rows"]:
        if r.get("error") or not r.get("fp8kit_s"):
            continue
        out[(r["section"], r["group"], r["case"])] = (r["fp8kit_s"], r.get("anchor_s"))
    return out


def model_rows(run: dict) -> dict:
    """The decoder bench's runs as bench rows: seconds per token, the
    framework's bf16 run as the anchor."""
    runs = [r for r in run["runs"] if r.get("tokens_per_s")]
    bf16 = {r["framework"]: 1.0 / r["tokens_per_s"] for r in runs if r["recipe"] == "bf16"}
    return {("models", run.get("config", ""), f'{r["framework"]} {r["recipe"]} {r["mode"]}'):
            (1.0 / r["tokens_per_s"], bf16.get(r["framework"])) for r in runs}


def compare(old: dict, new: dict, noise: float) -> tuple[list, list, list]:
    """(table lines, the keys of slower rows, keys in one run only)."""
    lines, slower = [], []
    for key in [k for k in old if k in new]:
        (f_old, a_old), (f_new, a_new) = old[key], new[key]
        change = f_new / f_old - 1.0
        drift = a_new / a_old - 1.0 if a_old and a_new else 0.0
        verdict = "SLOWER" if change - drift > noise else "faster" if drift - change > noise \
            else "same"
        if verdict == "SLOWER":
            slower.append(key)
        lines.append(f"{' / '.join(key)[:96]:96s} {change:+7.1%} {drift:+7.1%}  {verdict}")
    only = sorted(set(old) ^ set(new))
    return lines, slower, only


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old", help="the earlier run's bench.json or models_*.json")
    p.add_argument("new", help="the later run's, of the same kind")
    p.add_argument("--noise", type=float, default=0.03,
                   help="a row's time change beyond its anchor's that still counts as the "
                        "same (default 0.03: 3%%)")
    args = p.parse_args(argv)
    old, new = _load(args.old), _load(args.new)
    kinds = {"rows" in old, "rows" in new}
    if len(kinds) != 1 or not all(("rows" in r) or ("runs" in r) for r in (old, new)):
        print("error: pass two bench.json files or two models_*.json files", file=sys.stderr)
        return 2
    if _gpu(old) != _gpu(new):
        print(f"error: the runs are on different GPUs ({_gpu(old)} and {_gpu(new)}); their "
              "times do not compare: run both on one kind", file=sys.stderr)
        return 2
    rows = bench_rows if "rows" in old else model_rows
    lines, slower, only = compare(rows(old), rows(new), args.noise)
    print(f"{'row':96s} {'time':>7s} {'anchor':>7s}  (new vs old; noise {args.noise:.0%})")
    print("\n".join(lines))
    if only:
        print(f"\nin one run only ({len(only)}):")
        print("\n".join("  " + " / ".join(k) for k in only))
    print(f"\n{len(lines)} rows compared, {len(slower)} slower")
    return 1 if slower else 0


if __name__ == "__main__":
    sys.exit(main())
