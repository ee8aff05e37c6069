"""python -m fp8kit.inspect: reads a file of FP8 cast statistics that
StatsLog wrote.

  plot RUN.jsonl     one PNG: heat maps of the saturation and underflow
                     rates (tensors by logged steps) and the amax and scale
                     histories of a few tensors
  summary RUN.jsonl  the tensors whose casts lose most: highest mean
                     saturation rate, underflow rate, relative error

A bad argument, a file that cannot be read or a missing package ends it
with one `error:` line and exit status 2.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from fp8kit.inspect.plot import HEATMAP_METRICS, plot_run
from fp8kit.inspect.records import METRICS, read_run
from fp8kit.inspect.summary import summary_text
from fp8kit.models import cli_support


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fp8kit.inspect",
                                description=__doc__.split("\n\n")[0].replace("\n", " "))
    commands = p.add_subparsers(dest="command", required=True, metavar="{plot,summary}")
    plot = commands.add_parser("plot", help="draw a run's statistics to one PNG")
    plot.add_argument("run", metavar="RUN.jsonl", help="the file StatsLog wrote")
    plot.add_argument("--out", default=None,
                      help="the PNG (default: RUN with the suffix .png; a directory: "
                           "RUN's stem .png in it)")
    plot.add_argument("--tensors", nargs="+", metavar="NAME", default=None,
                      help="the line plots' tensors: names layer/role, or regular expressions "
                           "searched for in them (default: the few of the highest mean "
                           "saturation or underflow rate)")
    plot.add_argument("--metric", nargs="+", choices=METRICS, default=None, metavar="METRIC",
                      help=f"the heat maps' metrics, of {', '.join(METRICS)} (default: "
                           f"{' '.join(HEATMAP_METRICS)})")
    summary = commands.add_parser("summary", help="print the tensors whose casts lose most")
    summary.add_argument("run", metavar="RUN.jsonl", help="the file StatsLog wrote")
    summary.add_argument("--top", type=int, default=5, help="rows per table (default 5)")
    return p


def _records(path: str) -> list[dict]:
    """The records of the file; ValueError naming it when it cannot be read,
    has a malformed line or holds no step."""
    try:
        records = read_run(path)
    except OSError as e:
        raise ValueError(f"{path}: cannot read it: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text file") from None
    if not records:
        raise ValueError(f"{path}: no logged steps in it")
    return records


def _plot(args) -> int:
    records = _records(args.run)
    run = pathlib.Path(args.run)
    out = (cli_support.output_path(args.out, run.with_suffix(".png").name) if args.out
           else run.with_suffix(".png"))
    if out.resolve() == run.resolve():
        raise ValueError(f"--out: {out} is the run's file itself")
    cli_support.writable_dir(out.parent, "--out")
    try:
        path = plot_run(records, out, tensors=args.tensors,
                        metrics=tuple(args.metric or HEATMAP_METRICS), source=run.name)
    except ImportError as e:  # no matplotlib, checked after the arguments
        raise ValueError(str(e)) from None
    print(f"wrote {path}")
    return 0


def _summary(args) -> int:
    if args.top < 1:
        raise ValueError(f"--top={args.top} must be >= 1")
    print(summary_text(_records(args.run), top=args.top, source=pathlib.Path(args.run).name))
    return 0


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        return {"plot": _plot, "summary": _summary}[args.command](args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
