"""python -m fp8kit.inspect summary: the tensors whose FP8 casts lose most,
as small tables: the highest mean saturation rate, the highest mean
underflow rate and the highest mean relative error, each with its peak
and the step of the peak, and the tensors whose amax was NaN or inf."""

from __future__ import annotations

import math

from fp8kit.inspect.history import describe, histories, ranked

# (metric, heading, what a tensor with a nonzero peak did, whether only those are listed)
_SECTIONS = (
    ("saturation_rate", "highest mean saturation rate", "saturate", True),
    ("underflow_rate", "highest mean underflow rate", "underflow", True),
    ("relative_error", "highest mean relative error", None, False),
)


def fmt(value: float | None) -> str:
    """A value as the tables and the plots write it: 3 significant digits."""
    if value is None:
        return "-"
    if not math.isfinite(value):
        return "nan" if math.isnan(value) else "inf" if value > 0 else "-inf"
    return f"{value:.3g}"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Text lines of a table: the first column left-aligned, the others right."""
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    lines = []
    for r in [header] + rows:
        cells = [str(c).ljust(w) if i == 0 else str(c).rjust(w)
                 for i, (c, w) in enumerate(zip(r, widths))]
        lines.append("  " + "  ".join(cells).rstrip())
    return lines


def summary_text(records: list[dict], top: int = 5, source: str = "") -> str:
    """The summary of the records of one file (source: its name, for the
    first line). ValueError when there are none."""
    if not records:
        raise ValueError(f"{source or 'the run'}: no logged steps")
    hists = histories(records)
    lines = [f"{source + ': ' if source else ''}{describe(records)}"]
    for metric, heading, verb, nonzero_only in _SECTIONS:
        rows = ranked(hists, metric, top, nonzero_only)
        if verb is not None:
            count = len(ranked(hists, metric, len(hists), nonzero_only))
            heading += f" ({count} of {len(hists)} tensors {verb} at some logged step)"
        lines += ["", heading]
        if not rows:
            lines.append("  none" if verb is None else f"  no cast did ({metric} 0 throughout)")
            continue
        lines += table(["tensor", "mean", "peak", "at step"],
                       [[h.label, fmt(mean), fmt(peak), str(step)]
                        for h, mean, peak, step in rows])
    bad = [(h, h.non_finite_steps("amax")) for h in hists if h.non_finite_steps("amax")]
    if bad:
        lines += ["", f"non-finite amax: a NaN or inf in the tensor ({len(bad)} "
                      f"tensor{'s' if len(bad) > 1 else ''})"]
        lines += table(["tensor", "steps", "first at"],
                       [[h.label, str(len(s)), str(s[0])] for h, s in bad[:top]])
    return "\n".join(lines)
