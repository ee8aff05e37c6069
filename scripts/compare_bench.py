"""Did a change make any benchmark row slower? Compares two runs of the
bench (bench.json) or of the decoder bench (models_<config>_<framework>.json),
row by row, beside the drift of what the change did not touch.

    python scripts/compare_bench.py OLD.json NEW.json [OLD2.json NEW2.json ...]
                                    [--noise 0.03]

A bench row is matched by (section, group, case). Its fp8kit time is
compared, NEW against OLD, and so is its anchor's (bf16, TransformerEngine,
torchao: code the change did not touch), whose drift is what the machine
alone did between the two runs. A row is slower when its fp8kit time grew
by more than `--noise` beyond its own anchor's drift; a decoder row
(framework, recipe, mode) compares tokens/s beside the bf16 row of the
same framework. Rows in one run only, and rows that failed, are listed
apart. Runs on different GPUs are refused: their times do not compare.

Several pairs (rounds of scripts/ab_bench.sh, each OLD measured beside its
NEW) are the noise of unchanged rows measured: a row is then slower only
when it is slower in every pair, faster only when faster in every one.

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


def row_change(old: tuple, new: tuple) -> tuple[float, float]:
    """(the fp8kit time's change, its anchor's drift), NEW against OLD."""
    (f_old, a_old), (f_new, a_new) = old, new
    drift = a_new / a_old - 1.0 if a_old and a_new else 0.0
    return f_new / f_old - 1.0, drift


def compare(pairs: list, noise: float) -> tuple[list, list, list]:
    """(table lines, the keys of rows slower in every pair, keys missing
    from some run) over [(old rows, new rows), ...]."""
    lines, slower = [], []
    common = set.intersection(*(set(old) & set(new) for old, new in pairs))
    every = set.union(*(set(old) | set(new) for old, new in pairs))
    for key in [k for k in pairs[0][0] if k in common]:
        changes = [row_change(old[key], new[key]) for old, new in pairs]
        beyond = [change - drift for change, drift in changes]
        verdict = "SLOWER" if min(beyond) > noise else "faster" if max(beyond) < -noise \
            else "same"
        if verdict == "SLOWER":
            slower.append(key)
        if len(pairs) == 1:
            cells = f"{changes[0][0]:+7.1%} {changes[0][1]:+7.1%}"
        else:
            cells = " ".join(f"{b:+7.1%}" for b in beyond)
        lines.append(f"{' / '.join(key)[:96]:96s} {cells}  {verdict}")
    return lines, slower, sorted(every - common)


def _check_pair(old: dict, new: dict) -> str | None:
    """Why two runs do not compare, or None."""
    kinds = {"rows" in old, "rows" in new}
    if len(kinds) != 1 or not all(("rows" in r) or ("runs" in r) for r in (old, new)):
        return "pass bench.json files or models_*.json files, one kind in all"
    if _gpu(old) != _gpu(new):
        return (f"the runs are on different GPUs ({_gpu(old)} and {_gpu(new)}); their times "
                "do not compare: run both on one kind")
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", metavar="OLD NEW",
                   help="pairs of runs: the earlier run's bench.json or models_*.json, then "
                        "the later run's of the same kind; more pairs for more rounds")
    p.add_argument("--noise", type=float, default=0.03,
                   help="a row's time change beyond its anchor's that still counts as the "
                        "same (default 0.03: 3%%)")
    args = p.parse_args(argv)
    if len(args.runs) % 2:
        print("error: pass the runs in pairs, OLD NEW [OLD NEW ...]", file=sys.stderr)
        return 2
    runs = [_load(path) for path in args.runs]
    for other in runs[1:]:
        why = _check_pair(runs[0], other)
        if why:
            print(f"error: {why}", file=sys.stderr)
            return 2
    rows = bench_rows if "rows" in runs[0] else model_rows
    pairs = [(rows(runs[i]), rows(runs[i + 1])) for i in range(0, len(runs), 2)]
    lines, slower, only = compare(pairs, args.noise)
    if len(pairs) == 1:
        print(f"{'row':96s} {'time':>7s} {'anchor':>7s}  (new vs old; noise {args.noise:.0%})")
    else:
        heads = " ".join(f"{'pair ' + str(i + 1):>7s}" for i in range(len(pairs)))
        print(f"{'row':96s} {heads}  (time change beyond the anchor's, new vs old; slower or "
              f"faster only in every pair; noise {args.noise:.0%})")
    print("\n".join(lines))
    if only:
        print(f"\nin {'one run' if len(pairs) == 1 else 'some runs'} only ({len(only)}):")
        print("\n".join("  " + " / ".join(k) for k in only))
    every = "" if len(pairs) == 1 else f" in all {len(pairs)} pairs"
    print(f"\n{len(lines)} rows compared, {len(slower)} slower{every}")
    return 1 if slower else 0


if __name__ == "__main__":
    sys.exit(main())
