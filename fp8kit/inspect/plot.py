"""python -m fp8kit.inspect plot: one PNG of a run's cast statistics.

Heat maps (one per metric, by default saturation_rate and underflow_rate)
with the tensors as rows, in the file's order, and the logged steps as
columns, on a log colour scale; below them the amax history and the scale
history of a few tensors (by default those with the highest mean
saturation or underflow rate). Draws with matplotlib (the 'bench' extra).
"""

from __future__ import annotations

import itertools
import math
import os
import pathlib

from fp8kit.inspect.history import History, describe, histories, ranked, select
from fp8kit.inspect.records import METRICS

HEATMAP_METRICS = ("saturation_rate", "underflow_rate")
# How many tensors the line plots show by default, and at most.
DEFAULT_LINES = 4
MAX_LINES = 10
# Heat map colours: the scale, and what is outside it.
_CMAP = "YlOrRd"
_ZERO, _NOT_LOGGED, _NON_FINITE = "#c6dbef", "#969696", "black"  # light blue, grey


def default_tensors(hists: list[History], count: int = DEFAULT_LINES) -> list[History]:
    """The tensors of the highest mean saturation and underflow rates, taken
    in turns; without any, those of the highest mean relative error."""
    sat = ranked(hists, "saturation_rate", count, nonzero_only=True)
    under = ranked(hists, "underflow_rate", count, nonzero_only=True)
    chosen = {}
    for pair in itertools.zip_longest(sat, under):
        for row in pair:
            if row is not None:
                chosen.setdefault(id(row[0]), row[0])
    found = list(chosen.values())[:count]
    return found or [row[0] for row in ranked(hists, "relative_error", count)] or hists[:count]


def plot_run(records: list[dict], out: str | os.PathLike, tensors: list[str] | None = None,
             metrics: tuple = HEATMAP_METRICS, source: str = "") -> pathlib.Path:
    """Draws the records to the PNG `out` (see the module docstring) and
    returns its path. tensors: names ("layer/role") or regular expressions
    choosing the line plots' tensors (history.select). ValueError for no
    records, an unknown metric or tensor, or more than MAX_LINES tensors;
    ImportError without matplotlib."""
    if not records:
        raise ValueError(f"{source or 'the run'}: no logged steps")
    metrics = (metrics,) if isinstance(metrics, str) else tuple(metrics)
    bad = [m for m in metrics if m not in METRICS]
    if bad or not metrics:
        raise ValueError(f"--metric: unknown {bad}; choose from {', '.join(METRICS)}")
    hists = histories(records)
    lines = select(hists, tensors) if tensors else default_tensors(hists)
    if len(lines) > MAX_LINES:
        raise ValueError(f"--tensors: {len(lines)} tensors match; the line plots take at most "
                         f"{MAX_LINES}: name fewer")
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("matplotlib is not installed (the plot draws with it): "
                          "pip install matplotlib") from None
    steps = sorted({s for h in hists for s in h.steps})
    per_row = 0.16 if len(hists) <= 100 else 0.1
    heat_h = max(2.2, per_row * len(hists) + 1.2)
    line_h = 3.4
    fig = Figure(figsize=(13, heat_h * len(metrics) + line_h + 0.6), layout="constrained")
    grid = fig.add_gridspec(len(metrics) + 1, 2, height_ratios=[heat_h] * len(metrics) +
                            [line_h])
    for i, metric in enumerate(metrics):
        _heatmap(fig, fig.add_subplot(grid[i, :]), hists, steps, metric)
    _lines(fig.add_subplot(grid[-1, 0]), lines, "amax", legend=True)
    _lines(fig.add_subplot(grid[-1, 1]), lines, "scale", legend=False)
    fig.suptitle(f"{source + ': ' if source else ''}{describe(records)}", fontsize=10)
    out = pathlib.Path(out)
    fig.savefig(out, dpi=100)
    return out


def _heatmap(fig, ax, hists: list[History], steps: list[int], metric: str) -> None:
    import matplotlib
    import numpy as np
    from matplotlib.colors import LogNorm

    column = {s: j for j, s in enumerate(steps)}
    data = np.full((len(hists), len(steps)), np.nan)
    logged = np.zeros(data.shape, dtype=bool)  # a value at that step
    for i, h in enumerate(hists):
        for s, v in zip(h.steps, h.values[metric]):
            if v is not None:
                data[i, column[s]], logged[i, column[s]] = v, True
    finite = logged & np.isfinite(data)
    positive = data[finite & (data > 0)]
    vmax = float(positive.max()) if positive.size else 1.0
    vmin = min(float(positive.min()), vmax / 10) if positive.size else vmax / 10
    zero, non_finite = finite & (data <= 0), logged & ~finite
    shown = np.where(zero, vmin / 10, np.where(non_finite, vmax * 10, data))
    cmap = matplotlib.colormaps[_CMAP].with_extremes(under=_ZERO, over=_NON_FINITE,
                                                     bad=_NOT_LOGGED)
    image = ax.imshow(np.ma.masked_array(shown, ~logged), aspect="auto",
                      interpolation="nearest", cmap=cmap, norm=LogNorm(vmin, vmax))
    extend = {(False, False): "neither", (True, False): "min", (False, True): "max",
              (True, True): "both"}[(bool(zero.any()), bool(non_finite.any()))]
    fig.colorbar(image, ax=ax, extend=extend, pad=0.01, fraction=0.03)
    notes = ["light blue: 0"] if zero.any() else []
    notes += ["grey: no value"] if (~logged).any() else []
    notes += ["black: NaN or inf"] if non_finite.any() else []
    title = metric + (" (log scale; " + ", ".join(notes) + ")" if notes else " (log scale)")
    if not positive.size:
        title += ": 0 at every logged step" if not non_finite.any() else ""
    ax.set_title(title, fontsize=9)
    ax.set_yticks(range(len(hists)))
    ax.set_yticklabels([h.label for h in hists], fontsize=7 if len(hists) <= 100 else 5)
    ticks = sorted({round(k * (len(steps) - 1) / 9) for k in range(10)}) if len(steps) > 10 \
        else range(len(steps))
    ax.set_xticks(list(ticks))
    ax.set_xticklabels([str(steps[j]) for j in ticks], fontsize=8)
    ax.set_xlabel("step", fontsize=8)


def _lines(ax, hists: list[History], metric: str, legend: bool) -> None:
    """`metric` over the steps for each of `hists`, on a log axis: its
    positive finite values as a line, NaN or inf as an x at the top."""
    drawn = marked = False
    for h, color in zip(hists, itertools.cycle([f"C{k}" for k in range(10)])):
        points = [(s, v) for s, v in zip(h.steps, h.values[metric]) if v is not None]
        finite = [(s, v) for s, v in points if math.isfinite(v) and v > 0]
        if finite:
            ax.plot(*zip(*finite), marker=".", color=color, label=h.label)
            drawn = True
        for s in [s for s, v in points if not math.isfinite(v)]:
            ax.plot([s], [0.97], marker="x", color=color, transform=ax.get_xaxis_transform(),
                    clip_on=False)
            marked = True
    ax.set_title(metric + (" (x at the top: NaN or inf)" if marked else ""), fontsize=9)
    if not drawn:
        if not marked:
            why = ("no per-tensor scale (block scaling)" if metric == "scale"
                   else "no positive finite value")
            ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes,
                    fontsize=9)
            ax.set_xticks([])
        ax.set_yticks([])
        return
    ax.set_yscale("log")
    ax.set_xlabel("step", fontsize=8)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(fontsize=7)
