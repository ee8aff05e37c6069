"""One PNG per section: for each group of rows, fp8kit's and the anchor's
throughput (or time) per case, cases ordered by size, with the ratio
written over each pair."""

from __future__ import annotations

import pathlib

from fp8kit.bench.targets import TARGETS


def _groups(rows):
    groups = {}
    for r in rows:
        groups.setdefault(r.group, []).append(r)
    return groups


def plot_section(section: str, rows, path: pathlib.Path, title_note: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    groups = _groups(rows)
    n = len(groups)
    cols = min(2, n)
    nrows = (n + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(7.5 * cols, 3.9 * nrows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    for ax, (group, grows) in zip(axes.flat, groups.items()):
        grows = sorted(grows, key=lambda r: r.size)
        x = np.arange(len(grows))
        kit = [r.value("fp8kit") or 0.0 for r in grows]
        anc = [r.value("anchor") or 0.0 for r in grows]
        ax.bar(x - 0.2, kit, width=0.4, color="tab:red", label="fp8kit")
        ax.bar(x + 0.2, anc, width=0.4, color="tab:gray", label=grows[0].anchor)
        for xi, r in zip(x, grows):
            label = "error" if r.error else "-" if r.ratio is None else f"{r.ratio:.2f}x"
            top = max(r.value("fp8kit") or 0.0, r.value("anchor") or 0.0)
            ax.annotate(label, (xi, top), ha="center", va="bottom", fontsize=8,
                        xytext=(0, 2), textcoords="offset points")
        targets = sorted({r.target for r in grows if r.target})
        tnote = "; ".join(f"{t} >= {TARGETS[t].min_ratio:.2f}x" for t in targets)
        ax.set_title(group + (f"\n(target {tnote})" if tnote else ""), fontsize=9)
        ax.set_xticks(x)
        ax.set_xticklabels([r.case for r in grows], rotation=20, ha="right", fontsize=8)
        ax.set_ylabel(grows[0].unit + (" (lower is better)" if grows[0].unit in ("ms", "us")
                                       else ""))
        ax.margins(y=0.15)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"fp8kit.bench: {section}  -  {title_note}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_all(rows, out_dir: pathlib.Path, title_note: str) -> list[pathlib.Path]:
    paths = []
    sections = list(dict.fromkeys(r.section for r in rows))
    for s in sections:
        p = out_dir / f"bench_{s}.png"
        plot_section(s, [r for r in rows if r.section == s], p, title_note)
        paths.append(p)
    return paths
