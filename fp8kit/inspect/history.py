"""The records of a run regrouped per tensor: each tensor's values over the
logged steps, what the summary and the plots read.

A file may hold more than one run (framework, recipe): each tensor of each
is a history of its own, and its label then names the run. A step logged
twice for the same tensor (a run resumed from a checkpoint appends the
steps after it again) keeps the later line's values.
"""

from __future__ import annotations

import dataclasses
import math
import re

from fp8kit.inspect.records import METRICS


@dataclasses.dataclass
class History:
    """One tensor's values at the steps it was logged at, in step order."""

    framework: str
    recipe: str
    name: str                     # "layer/role"
    steps: list[int]
    values: dict[str, list]       # metric -> [float or None], aligned with steps
    label: str = ""               # name, prefixed with the run in a file of several

    def mean(self, metric: str) -> float | None:
        """The mean over the steps with a value (None without any); NaN or
        inf when a value is."""
        vals = [v for v in self.values[metric] if v is not None]
        return sum(vals) / len(vals) if vals else None

    def peak(self, metric: str) -> tuple[float, int] | None:
        """(the largest value, the first step it occurs at), NaN above every
        number; None when no step has a value."""
        best = None
        for step, v in zip(self.steps, self.values[metric]):
            if v is not None and (best is None or rank_key(v) > rank_key(best[0])):
                best = (v, step)
        return best

    def non_finite_steps(self, metric: str) -> list[int]:
        return [s for s, v in zip(self.steps, self.values[metric])
                if v is not None and not math.isfinite(v)]


def rank_key(value: float) -> tuple:
    """Sort key for "larger is worse": NaN above inf above every number."""
    return (math.isnan(value), -math.inf if math.isnan(value) else value)


def ranked(hists: list[History], metric: str, top: int, nonzero_only: bool = False) -> list:
    """The `top` histories of the highest mean of `metric` (NaN and inf
    first; ties: the higher peak, then the file's order) as (history, mean,
    peak, peak step); those without a value left out, and with
    nonzero_only those whose values are all 0 too."""
    rows = []
    for h in hists:
        mean, peak = h.mean(metric), h.peak(metric)
        if mean is None or (nonzero_only and peak[0] == 0):
            continue
        rows.append((h, mean, peak[0], peak[1]))
    rows.sort(key=lambda r: (rank_key(r[1]), rank_key(r[2])), reverse=True)
    return rows[:top]


def runs(records: list[dict]) -> list[tuple[str, str]]:
    """The (framework, recipe) pairs of the records, in order of appearance."""
    return list(dict.fromkeys((r["framework"], r["recipe"]) for r in records))


def describe(records: list[dict]) -> str:
    """One line about the records: the run(s), the logged steps, the tensors."""
    pairs = runs(records)
    run_text = (f"{pairs[0][0]}, {pairs[0][1]}" if len(pairs) == 1 else
                f"{len(pairs)} runs ({'; '.join(f'{f}, {r}' for f, r in pairs)})")
    steps = sorted({r["step"] for r in records})
    names = {(r["framework"], r["recipe"], n) for r in records for n in r["tensors"]}
    return (f"{run_text}; {len(steps)} logged steps ({steps[0]}..{steps[-1]}), "
            f"{len(names)} tensors")


def histories(records: list[dict]) -> list[History]:
    """One History per (framework, recipe, tensor name) of the records, in
    order of first appearance (the collectors' order: the model's)."""
    by_key: dict[tuple, dict[int, dict]] = {}
    for r in records:
        for name, fields in r["tensors"].items():
            by_key.setdefault((r["framework"], r["recipe"], name), {})[r["step"]] = fields
    several = len(runs(records)) > 1
    out = []
    for (framework, recipe, name), by_step in by_key.items():
        steps = sorted(by_step)
        values = {m: [_number(by_step[s].get(m)) for s in steps] for m in METRICS}
        label = f"{framework} {recipe}: {name}" if several else name
        out.append(History(framework, recipe, name, steps, values, label))
    return out


def _number(value) -> float | None:
    return None if value is None else float(value)


def select(hists: list[History], patterns: list[str]) -> list[History]:
    """The histories each pattern names, in the order given, each once: a
    pattern equal to a tensor's name ("layer/role") or label names it;
    otherwise it is a regular expression searched for in the labels.
    ValueError for a pattern that names none, listing a few known names."""
    chosen = {}
    for pattern in patterns:
        hits = _hits_exact(hists, pattern) or _hits_regex(hists, pattern)
        if not hits:
            known = list(dict.fromkeys(h.label for h in hists))
            more = f", ... ({len(known)} in all)" if len(known) > 6 else ""
            raise ValueError(f"--tensors: '{pattern}' names no tensor of the file; known: "
                             f"{', '.join(known[:6])}{more}")
        for h in hits:
            chosen[id(h)] = h
    return list(chosen.values())


def _hits_exact(hists: list[History], pattern: str) -> list[History]:
    return [h for h in hists if pattern in (h.name, h.label)]


def _hits_regex(hists: list[History], pattern: str) -> list[History]:
    try:
        regex = re.compile(pattern)
    except re.error as e:
        raise ValueError(f"--tensors: '{pattern}' is no tensor name and no regular expression "
                         f"({e})") from None
    return [h for h in hists if regex.search(h.label)]
