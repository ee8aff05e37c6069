"""What every section of the suite gets: the mode, the devices, the timing
settings, and the Case type sections return."""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

from fp8kit.bench.timing import Settings


@dataclasses.dataclass
class Context:
    quick: bool                   # tiny sizes, few iterations: checks the suite works
    torch_device: str             # "cuda" or "cpu"
    settings: Settings
    gemm_shapes: tuple = ()       # M x N x K override for the GEMM section
    torch_compile: bool = True    # include torch.compile peers (full mode only)
    profile: bool = False         # overhead section: torch.profiler table of the per-call path
    # Text reports cases add (title -> text, e.g. profiler tables): printed
    # after the results table and stored in the JSON under "profiles".
    profiles: dict = dataclasses.field(default_factory=dict)

    @property
    def claims(self) -> bool:
        """Whether this run's numbers are performance claims: a full run on
        a GPU. CPU numbers (fp8kit's reference kernels) never are."""
        return not self.quick and self.torch_device == "cuda"


@dataclasses.dataclass
class Case:
    """One unit of progress: run() measures and returns the case's rows."""

    section: str
    group: str                    # used for the error row if run() raises
    name: str
    run: Callable[[], list]


def shape_cases(ctx: Context, section: str, group: str, label: str, run_shape: Callable,
                shapes: list, quick_shapes: list) -> list[Case]:
    """One Case per (rows, cols) shape of a kernel section, named
    "<label> <rows>x<cols>": run_shape(ctx, rows, cols, seed), the shape's
    index its seed; quick_shapes in quick mode."""
    return [Case(section, group, f"{label} {r}x{c}", functools.partial(run_shape, ctx, r, c, i))
            for i, (r, c) in enumerate(quick_shapes if ctx.quick else shapes)]


def copy_anchored(rows: dict, t: dict, n: int, copies: int, bytes_per_element: float) -> None:
    """Fills the rows of a kernel section timed beside a 4-byte-per-element
    device copy (t["copy"], n elements, `copies` input copies rotated past
    L2): each row's note, its kernel time t[name] where it was timed, and
    as anchor the copy's time scaled to the kernel's bytes_per_element."""
    t_copy = t["copy"].median_s
    for name, row in rows.items():
        row.note = f"copy {4 * n / t_copy / 1e12:.3g} TB/s (4 B/el), {copies} input copies"
        if name in t:
            row.fp8kit_s = t[name].median_s
            row.anchor_s = t_copy * bytes_per_element / 4
            row.timing = {"fp8kit": t[name].to_json(), "copy": t["copy"].to_json()}
