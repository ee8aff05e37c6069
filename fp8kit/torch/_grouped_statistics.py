"""GroupedLinear's cast statistics at a logged step of fp8kit.torch.inspect.

A grouped cast is read by the core's statistics op
(torch.ops.fp8kit.cast_statistics) with each expert's own scale: under
per-tensor scaling in one call, each row read with its expert's scale_inv
(scaling mode "per_row"); under block scaling one call per expert with
its block scales, the results merged on the device. Either way the layer's
row of the recorder's buffer (the row fp8kit.torch.Linear's C++ call fills,
fp8kit/torch/_cast_records.py) holds amax the largest expert's (NaN if any
is NaN), the counts and the sums over all experts. A grouped cast has a
scale per expert, so the row holds no one scale (scale_inv NaN, as under
block scaling). An expert with no tokens adds nothing.

Block scaling finds each expert's rows and scales from the counts on the
host: counts on the GPU are read back there, which waits for the stream,
at logged steps only.
"""

from __future__ import annotations

import math

import torch

from fp8kit.torch._ext import ext

_ops = torch.ops.fp8kit
_COLUMNS = ext.STATISTICS_COLUMNS


def _padded(m: int) -> int:
    """An expert's rows in the block-scaled padded row layout (fp8kit/grouped.h)."""
    step = ext.GEMM_DIM_MULTIPLE
    return (m + step - 1) // step * step


def per_tensor_parts(x, data, scale_inv, row_experts) -> list:
    """The one part of a per-tensor grouped cast: x [T, F] and its rowwise
    copy in the contiguous layout, read with each row's expert's scale_inv
    (scale_inv [E, STRIDE], row_experts [T] on the device; scaling mode
    "per_row"), gathered there without a host read of the counts."""
    return [(x, data, scale_inv[:, 0].index_select(0, row_experts).contiguous())]


def block_parts(x, data, scales, counts, mode: str) -> list:
    """[(x_e, data_e, scales_e)] of the experts with rows: x [rows, F] and
    its rowwise copy in the padded row layout, each expert's block scales
    (block_scaling.h's layout for a tensor [p_e, F]) one after another."""
    features = x.shape[1]
    parts, row, at = [], 0, 0
    for m in counts:
        p = _padded(m)
        shape = ext.block_scale_inv_shape((p, features), mode)
        size = shape[0] * shape[1]
        if m:
            parts.append((x[row:row + p], data[row:row + p], scales[at:at + size].view(shape)))
        row, at = row + p, at + size
    return parts


def record(rows, slot: int, parts: list, mode: str) -> None:
    """Writes the merged statistics of `parts` (per_tensor_parts' with mode
    "per_row", or block_parts') into rows[slot]; nothing when there are no
    parts (no expert had rows)."""
    if not parts:
        return
    stats = [_ops.cast_statistics(x.detach(), d, s, mode, False) for x, d, s in parts]
    amax, underflow, saturated, error_sq, norm_sq = (torch.stack(c) for c in zip(*stats))
    values = {"amax": amax.max(), "underflow": _bits(underflow.sum()),
              "saturated": _bits(saturated.sum()), "error_sq": error_sq.sum(),
              "norm_sq": norm_sq.sum(), "scale_inv": torch.full_like(amax[0], math.nan),
              "recorded": torch.ones_like(amax[0])}
    rows[slot] = torch.stack([values[c] for c in _COLUMNS])


def _bits(count: torch.Tensor) -> torch.Tensor:
    """A count as the float32 whose bits are its uint32, as the C++ rows hold it."""
    return count.to(torch.int32).reshape(1).view(torch.float32)[0]
