"""The demo's FP8 cast statistics: each FP8 run logs them every N steps
(fp8kit.inspect) beside the loss plot, as <plot stem>_fp8_<framework>.jsonl;
after the runs the demo prints which casts lose most and plots each file."""

from __future__ import annotations

import pathlib


def log_path(out_png: pathlib.Path, framework: str) -> pathlib.Path:
    return out_png.with_name(f"{out_png.stem}_fp8_{framework}.jsonl")


def open_log(out_png: pathlib.Path, framework: str, every: int):
    """The StatsLog a framework's FP8 run writes to, None when every is 0."""
    if not every:
        return None
    from fp8kit.inspect import StatsLog
    return StatsLog(log_path(out_png, framework), every=every)


def report(paths) -> str:
    """The summary of each written file (its three most lossy casts per
    measure), each file plotted beside itself; the text to print."""
    from fp8kit.inspect import plot_run, read_run, summary_text
    parts = []
    for path in paths:
        records = read_run(path)
        if not records:
            continue
        png = plot_run(records, path.with_suffix(".png"), source=path.name)
        parts.append(f"{summary_text(records, top=3, source=path.name)}\nplot: {png.resolve()}")
    return "\n\n".join(parts)
