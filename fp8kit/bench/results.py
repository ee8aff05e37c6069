"""Rows of the benchmark suite, the printed table, the target summary and
the JSON document."""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from fp8kit.bench.targets import TARGETS

_SCALE = {"TFLOP/s": 1e-12, "TB/s": 1e-12}   # throughput units: work / seconds * scale
_TIME = {"ms": 1e3, "us": 1e6}               # time units: seconds * factor
# Size units: the work is bytes (value: bytes * factor), no times; the ratio
# is anchor bytes / fp8kit bytes (> 1: fp8kit needs less).
_SIZE = {"MiB": 2.0 ** -20}


@dataclasses.dataclass
class Row:
    section: str                  # gemm / quantize / linear / overhead
    group: str                    # a plot panel and table block ("e4m3 GEMM, split accumulation")
    case: str                     # what varies within the group, e.g. "8192x8192x8192"
    size: float                   # orders the cases (FLOPs, elements)
    unit: str                     # TFLOP/s, TB/s, ms, us or MiB
    anchor: str                   # what fp8kit is compared with
    fp8kit_s: Optional[float] = None
    anchor_s: Optional[float] = None
    fp8kit_work: Optional[float] = None   # FLOPs or bytes per call (throughput, size units)
    anchor_work: Optional[float] = None
    target: Optional[str] = None          # key of TARGETS, or None (for information)
    check: str = ""                       # how fp8kit's output was checked, and the result
    error: Optional[str] = None           # set when the row could not be measured
    note: str = ""
    timing: dict = dataclasses.field(default_factory=dict)  # Timing.to_json() per side

    def set_times(self, timings: dict) -> None:
        """Records timing.measure's result for the sides "fp8kit" and
        "anchor": their medians and every side's Timing."""
        self.fp8kit_s, self.anchor_s = timings["fp8kit"].median_s, timings["anchor"].median_s
        self.timing = {side: v.to_json() for side, v in timings.items()}

    def value(self, side: str) -> Optional[float]:
        t = self.fp8kit_s if side == "fp8kit" else self.anchor_s
        work = self.fp8kit_work if side == "fp8kit" else self.anchor_work
        if self.unit in _SIZE:
            return None if work is None else work * _SIZE[self.unit]
        if t is None:
            return None
        if self.unit in _TIME:
            return t * _TIME[self.unit]
        return work / t * _SCALE[self.unit]

    @property
    def ratio(self) -> Optional[float]:
        if self.unit in _SIZE:
            if not self.fp8kit_work or self.anchor_work is None:
                return None
            return self.anchor_work / self.fp8kit_work
        if not self.fp8kit_s or not self.anchor_s:
            return None
        return self.anchor_s / self.fp8kit_s

    def met(self, claims: bool) -> Optional[bool]:
        """Target met? None when there is no target, no number, or the run
        makes no performance claims (CPU quick mode)."""
        if not claims or self.target is None or self.ratio is None:
            return None
        return self.ratio >= TARGETS[self.target].min_ratio

    def to_json(self, claims: bool) -> dict:
        d = dataclasses.asdict(self)
        d.update(fp8kit_value=self.value("fp8kit"), anchor_value=self.value("anchor"),
                 ratio=self.ratio, met=self.met(claims),
                 target_min_ratio=TARGETS[self.target].min_ratio if self.target else None)
        return d


def _fmt(v, spec="8.3g"):
    return "-" if v is None else format(v, spec)


def ordered(rows: list[Row]) -> list[Row]:
    """Rows grouped (sections and groups in order of first appearance),
    cases by size within a group."""
    first = {}
    for i, r in enumerate(rows):
        first.setdefault((r.section, r.group), i)
    return sorted(rows, key=lambda r: (first[(r.section, r.group)], r.size))


def table(rows: list[Row], claims: bool) -> str:
    rows = ordered(rows)
    out = []
    w_case = max([len(r.case) for r in rows] + [12])
    w_anchor = max([len(r.anchor) for r in rows] + [6])
    head = (f"  {'case':<{w_case}} {'unit':>7} {'fp8kit':>9} {'anchor':>9} {'ratio':>7} "
            f"{'target':>12} {'result':>7}  {'anchor':<{w_anchor}}  check")
    current = None
    for r in rows:
        if (r.section, r.group) != current:
            current = (r.section, r.group)
            out += ["", f"[{r.section}] {r.group}", head, "  " + "-" * (len(head) + 6)]
        tgt = f"{r.target}>={TARGETS[r.target].min_ratio:.2f}" if r.target else "-"
        met = r.met(claims)
        result = ("ERROR" if r.error else "-" if met is None else "met" if met else "MISS")
        check = r.error or r.check
        if not r.error and r.ratio is None and r.note:   # a row without numbers says why
            check = f"{check}; {r.note}" if check else r.note
        out.append(f"  {r.case:<{w_case}} {r.unit:>7} {_fmt(r.value('fp8kit'))} "
                   f"{_fmt(r.value('anchor'))} {_fmt(r.ratio, '7.3f')} {tgt:>12} {result:>7}  "
                   f"{r.anchor:<{w_anchor}}  {check}")
    return "\n".join(out)


def summarize_targets(rows: list[Row], claims: bool) -> dict:
    """Per target: its rows' ratios, the geomean per group where the target
    asks for one, and whether it is met (None without claims)."""
    summary = {}
    for tid, target in TARGETS.items():
        mine = [r for r in rows if r.target == tid]
        if not mine:
            continue
        ratios = [r.ratio for r in mine]
        complete = all(v is not None for v in ratios) and not any(r.error for r in mine)
        entry = {"text": target.text, "rows": len(mine), "complete": complete,
                 "min_ratio": min((v for v in ratios if v is not None), default=None)}
        met = complete and all(v >= target.min_ratio for v in ratios)
        if target.geomean_min is not None:
            groups = {}
            for r in mine:
                groups.setdefault(r.group, []).append(r.ratio)
            entry["geomean"] = {}
            for g, vals in groups.items():
                vals = [v for v in vals if v is not None]
                geo = math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None
                entry["geomean"][g] = geo
                met = met and geo is not None and geo >= target.geomean_min
        entry["met"] = met if claims else None
        summary[tid] = entry
    return summary


def summary_text(summary: dict, claims: bool) -> str:
    lines = ["", "Targets (docs/benchmarks.md; ratio = anchor time / fp8kit time, same run, "
             "same inputs):"]
    for tid, e in summary.items():
        state = ("n/a (CPU quick mode: not a performance claim)" if not claims else
                 "incomplete" if not e["complete"] else "MET" if e["met"] else "NOT MET")
        extra = ""
        if "geomean" in e:
            extra = "; geomean " + ", ".join(f"{g}: {_fmt(v, '.3f')}"
                                             for g, v in e["geomean"].items())
        lines.append(f"  {tid:<11} {state:<12} min ratio {_fmt(e['min_ratio'], '.3f')}{extra}"
                     f"   ({e['text']})")
    return "\n".join(lines)
