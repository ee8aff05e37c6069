"""GPU kernel times from a torch.profiler trace (CUPTI sees every kernel of
the process, XLA's too): the busy time of a set of kernels, a step's time
split into kinds of work, and the kernels that take the most of it.

Kinds, by kernel name (the first pattern that matches wins):
    gemm       cuBLAS / cuBLASLt kernels (nvjet, cutlass, xmma, gemm)
    attention  flash / fused multi-head attention and cuDNN's SDPA kernels
    fp8kit     fp8kit's own kernels (casts, norms, activations, updates)
    te         TransformerEngine's own kernels (the same jobs as fp8kit's:
               a TE step's casts would otherwise hide among 'other'), its
               runtime-compiled (NVRTC) cast+transpose kernels too, which
               carry no namespace
    optimizer  the optimizer's fused or foreach kernels (AdamW)
    other      everything else: elementwise, reductions, copies, XLA fusions
idle is the step's window (first kernel start to last kernel end) minus
the time some kernel was running: launch gaps and host-side waits.
"""

from __future__ import annotations

import collections
import re

KINDS = ("gemm", "attention", "fp8kit", "te", "optimizer", "other")
_PATTERNS = (
    ("attention", re.compile(r"flash|fmha|attention|sdpa|cudnn", re.I)),
    ("fp8kit", re.compile(r"fp8kit")),
    ("te", re.compile(r"transformer_engine|^(cast_)?transpose_optimized_kernel")),
    ("gemm", re.compile(r"nvjet|cutlass|xmma|gemm|sm90_.*tensorop|cublas", re.I)),
    ("optimizer", re.compile(r"adam|multi_tensor_apply|foreach|fused_.*optim", re.I)),
)


def kind_of(kernel_name: str) -> str:
    for kind, pattern in _PATTERNS:
        if pattern.search(kernel_name):
            return kind
    return "other"


def busy_and_span(intervals) -> tuple:
    """(time covered by the union of [start, end) intervals, last end - first
    start): the GPU's busy time and the window it was measured in."""
    busy, span_start, reach = 0.0, None, None
    for start, end in sorted(intervals):
        if span_start is None:
            span_start, reach = start, start
        if end > reach:
            busy += end - max(start, reach)
            reach = end
    return busy, (0.0 if span_start is None else reach - span_start)


def breakdown(kernels, steps: int) -> dict:
    """{kind: microseconds per step} (and 'idle', 'window') from kernels
    given as (name, start_us, end_us) over `steps` steps. Kernel times of a
    kind are summed (overlapping kernels of two streams both count), idle
    comes from the union of all kernels."""
    kernels = list(kernels)
    out = {kind: 0.0 for kind in KINDS}
    for name, start, end in kernels:
        out[kind_of(name)] += (end - start) / steps
    busy, span = busy_and_span((s, e) for _, s, e in kernels)
    out["idle"] = (span - busy) / steps
    out["window"] = span / steps
    return out


def table(times: dict) -> str:
    """The breakdown as lines 'kind  ms per step  % of the window'."""
    window = times["window"] or 1.0
    lines = [f"{'kind':<10} {'ms/step':>8} {'% step':>7}"]
    for kind in (*KINDS, "idle"):
        lines.append(f"{kind:<10} {times[kind] / 1e3:8.2f} {100 * times[kind] / window:6.1f}%")
    lines.append(f"{'step':<10} {window / 1e3:8.2f}")
    return "\n".join(lines)


def short_name(kernel_name: str) -> str:
    """A demangled kernel name without its return type, its parameter list
    and the namespaces and classes that qualify its names (template
    arguments kept: they tell a kernel's variants apart)."""
    name = kernel_name.strip()
    if name.startswith("void "):
        name = name[len("void "):]
    if name.endswith(")"):   # drop the parameter list: from its '(' to the end
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                if name[i - 1:i] != " ":   # "Memset (Device)" has no parameters
                    name = name[:i]
                break
    return _QUALIFIER.sub("", name)


_QUALIFIER = re.compile(r"(?:[A-Za-z_]\w*|\(anonymous namespace\))::")


def top_kernels(kernels, steps: int, count: int) -> list[tuple]:
    """The `count` kernels (by short_name) that ran longest, as (name, kind,
    calls per step, microseconds per step), longest first, from kernels
    given as (name, start_us, end_us) over `steps` steps."""
    time, calls, kinds = collections.Counter(), collections.Counter(), {}
    for name, start, end in kernels:
        short = short_name(name)
        time[short] += (end - start) / steps
        calls[short] += 1
        kinds.setdefault(short, kind_of(name))
    return [(name, kinds[name], calls[name] / steps, us) for name, us in time.most_common(count)]


def kernel_table(top, width: int = 100) -> str:
    """top_kernels' rows as lines 'us/step  calls/step  kind  name' (names
    cut to `width` characters)."""
    lines = [f"{'us/step':>9} {'calls':>6} {'kind':<9} kernel"]
    for name, kind, calls, us in top:
        shown = name if len(name) <= width else name[:width - 3] + "..."
        lines.append(f"{us:9.1f} {calls:6.1f} {kind:<9} {shown}")
    return "\n".join(lines)
