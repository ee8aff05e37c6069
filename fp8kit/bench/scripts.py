"""What the benchmarks/bench_*.py scripts share: each is a thin wrapper
that runs some sections of the suite (python -m fp8kit.bench --sections
...) with the same few flags, the PNGs next to the JSON file."""

from __future__ import annotations

import argparse
import os


def parser(doc: str, out: str) -> argparse.ArgumentParser:
    """--out, --rounds, --quick and --no-compile; `doc` is the script's docstring."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--out", default=out, help="JSON results file (PNGs go next to it)")
    p.add_argument("--rounds", type=int, default=None,
                   help="timed rounds per function (default: the suite's)")
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes, few iterations, also on the CPU (a smoke run, not a "
                        "measurement)")
    p.add_argument("--no-compile", action="store_true",
                   help="skip the torch.compile peers (they compile for a while)")
    return p


def run(args, sections: str, extra=()) -> int:
    """Runs the suite's `sections` (comma-separated) with the parsed flags."""
    from fp8kit.bench.cli import main as suite

    argv = ["--sections", sections, "--quick" if args.quick else "--full", "--json", args.out,
            "--out", os.path.dirname(os.path.abspath(args.out)), *extra]
    if args.rounds:
        argv += ["--rounds", str(args.rounds)]
    if args.no_compile:
        argv.append("--no-compile")
    return suite(argv)


def main(doc: str, sections: str, out: str, extra=()) -> int:
    return run(parser(doc, out).parse_args(), sections, extra)
