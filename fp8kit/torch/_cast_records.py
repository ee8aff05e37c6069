"""What fp8kit.torch.inspect gives the layers at a logged step, and how
their device values become one step's TensorStats.

A layer being inspected holds a LayerRecorder in `_fp8_inspect` (the
layers' class attribute is None: not inspected). Its calls:

    record(gemm, role, x, data, scale_inv, ...)
        a cast the layer ran in Python (block scaling):
        x the high-precision tensor, data the FP8 copy it wrote (or
        columnwise_data, read from the columnwise layout), scale_inv its
        scale_inv or block scales; torch.ops.fp8kit.cast_statistics runs on
        them at once, on the device, asynchronously;
    linear_statistics(gemm, tokens, weight)
        the buffer that the per-tensor Linear's C++ forward and backward
        fill beside their own casts (ext.linear_forward's `statistics`,
        also the fused layers' GEMMs');
    refuse_tracing()
        the error of a layer asked to record while torch.compile traces.

gemm is "" for a layer with one GEMM and "fc1" / "fc2" for LayerNormMLP's;
role is one of fp8kit.inspect.records.ROLES. Nothing here waits for the
device: StepRecords.to_host packs every value of the step into one tensor
per device and starts one copy to the host, and HostCopy.tensor_stats reads
it once that copy is done.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np
import torch

from fp8kit.inspect.records import ROLES, TensorStats
from fp8kit.torch._ext import ext
from fp8kit.torch.autocast import STATE as _AUTOCAST

_ops = torch.ops.fp8kit
_COLUMNS = {name: i for i, name in enumerate(ext.STATISTICS_COLUMNS)}
_ROLE_SLOTS = ((ROLES[0], ext.SLOT_INPUT), (ROLES[1], ext.SLOT_WEIGHT),
               (ROLES[2], ext.SLOT_GRAD_OUTPUT))


def refuse_tracing_error() -> RuntimeError:
    return RuntimeError(
        "fp8kit.torch.inspect: an inspected layer is being traced by torch.compile or "
        "torch.export; inspection runs eagerly only. Inspect the eager model (close the "
        "handle, or leave its `with` block, before compiling), or compile without inspection")


class _Cast(NamedTuple):
    """One cast's device values (cast_statistics' five, and its scale_inv)."""
    name: str
    role: str
    numel: int
    stats: tuple  # amax, underflow, saturated, error_sq, norm_sq (0-d tensors)
    scale_inv: Optional[torch.Tensor]  # float32 [1]; None under block scaling


class _LinearCall(NamedTuple):
    """One inspected C++ Linear call: its statistics rows and the numels."""
    name: str
    numels: tuple  # input, weight, grad_output
    rows: torch.Tensor  # float32 [3, len(STATISTICS_COLUMNS)]


class StepRecords:
    """The casts recorded at one logged step, still on their devices."""

    def __init__(self, step: int, roles: frozenset):
        self.step = step
        self.roles = roles
        self.recipes: set = set()
        self.casts: list = []
        self.linear_calls: list = []
        self.closed = False  # handed to the host: later records are dropped

    def to_host(self) -> "HostCopy":
        """Packs the step's values (one tensor per device) and starts their
        copy to the host; no wait."""
        self.closed = True
        by_device: dict = {}
        for c in self.casts:
            by_device.setdefault(c.stats[0].device, ([], []))[0].append(c)
        for call in self.linear_calls:
            by_device.setdefault(call.rows.device, ([], []))[1].append(call)
        parts = [_Packed(casts, calls) for casts, calls in by_device.values()]
        return HostCopy(self.step, sorted(self.recipes), parts, self.roles)


class _Packed:
    """One device's values of a step in one float32 tensor, copied to the
    host: each cast's amax, error_sq, norm_sq and scale_inv (NaN: none),
    then the casts' int64 counts in float32 pairs, then the Linear rows."""

    def __init__(self, casts: list, calls: list):
        self.casts, self.calls = casts, calls
        pieces = []
        if casts:
            nan = None
            floats = []
            for c in casts:
                amax, _, _, error_sq, norm_sq = c.stats
                if c.scale_inv is None and nan is None:
                    nan = torch.full((), float("nan"), device=amax.device)
                floats += [amax, error_sq, norm_sq,
                           c.scale_inv.reshape(()) if c.scale_inv is not None else nan]
            counts = torch.stack([t for c in casts for t in (c.stats[1], c.stats[2])])
            pieces += [torch.stack(floats), counts.view(torch.float32)]
        if calls:
            pieces.append(torch.stack([call.rows for call in calls]).view(-1))
        packed = torch.cat(pieces) if len(pieces) > 1 else pieces[0]
        self.event = None
        if packed.device.type == "cuda":
            with torch.cuda.device(packed.device):  # the event on that device's stream
                host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
                host.copy_(packed, non_blocking=True)
                self.event = torch.cuda.Event()
                self.event.record()
            packed = host
        self.host = packed

    def ready(self) -> bool:
        return self.event is None or self.event.query()

    def tensor_stats(self, roles: frozenset) -> list:
        if self.event is not None:
            self.event.synchronize()
        values = self.host.numpy()
        out = []
        n = len(self.casts)
        floats = values[:4 * n].reshape(n, 4)
        counts = values[4 * n:8 * n].view(np.int64).reshape(n, 2)
        for c, f, k in zip(self.casts, floats, counts):
            scale = None if np.isnan(f[3]) else _scale(f[3])
            out.append(TensorStats(c.name, c.role, float(f[0]), scale, c.numel, int(k[0]),
                                   int(k[1]), float(f[1]), float(f[2])))
        rows = values[8 * n:].reshape(len(self.calls), ext.NUM_SLOTS, len(_COLUMNS))
        for call, table in zip(self.calls, rows):
            for (role, slot), numel in zip(_ROLE_SLOTS, call.numels):
                row = table[slot]
                if role not in roles or row[_COLUMNS["recorded"]] != 1:
                    continue
                bits = row.view(np.uint32)
                out.append(TensorStats(
                    call.name, role, float(row[_COLUMNS["amax"]]),
                    _scale(row[_COLUMNS["scale_inv"]]), numel,
                    int(bits[_COLUMNS["underflow"]]), int(bits[_COLUMNS["saturated"]]),
                    float(row[_COLUMNS["error_sq"]]), float(row[_COLUMNS["norm_sq"]])))
        return out


def _scale(scale_inv) -> float:
    """The per-tensor scale a cast used: 1 / its float32 scale_inv."""
    return 1.0 / float(scale_inv) if scale_inv != 0 else float("inf")


class HostCopy:
    """A step's values on their way to the host."""

    def __init__(self, step: int, recipes: list, parts: list, roles: frozenset):
        self.step, self.recipes, self.parts, self.roles = step, recipes, parts, roles

    def ready(self) -> bool:
        return all(p.ready() for p in self.parts)

    def tensor_stats(self) -> list:
        """The step's TensorStats (waiting for the copy if it is not done):
        a layer called several times in the recorded forward (a shared one)
        gives one entry per tensor: amax the max, the counts, numel and sums
        added, the scale its first recorded call's."""
        merged: dict = {}
        for part in self.parts:
            for t in part.tensor_stats(self.roles):
                first = merged.get(t.name)
                merged[t.name] = t if first is None else _merge(first, t)
        return list(merged.values())


def _merge(a: TensorStats, b: TensorStats) -> TensorStats:
    return TensorStats(a.layer, a.role, _nan_max(a.amax, b.amax), a.scale, a.numel + b.numel,
                       a.underflow + b.underflow, a.saturated + b.saturated,
                       a.error_sq + b.error_sq, a.norm_sq + b.norm_sq)


def _nan_max(a: float, b: float) -> float:
    return a if a != a else b if b != b else max(a, b)  # NaN first, as an amax propagates it


class LayerRecorder:
    """The `_fp8_inspect` of one layer at one logged step."""

    def __init__(self, records: StepRecords, names: dict):
        self._records = records
        self._names = names  # {gemm: the GEMM's name}, the GEMMs inspected only

    def refuse_tracing(self):
        raise refuse_tracing_error()

    def _open(self, gemm: str) -> Optional[str]:
        """The GEMM's name if its casts are wanted now, else None."""
        if torch.compiler.is_compiling():
            raise refuse_tracing_error()
        r = self._records
        name = self._names.get(gemm)
        if r.closed or name is None:  # closed: a backward that ran after its step was read
            return None
        if _AUTOCAST.recipe is not None:
            r.recipes.add(type(_AUTOCAST.recipe).__name__)
        return name

    def record(self, gemm: str, role: str, x: torch.Tensor, data, scale_inv: torch.Tensor,
               scaling_mode: str = "per_tensor", columnwise_data=None,
               numel: Optional[int] = None) -> None:
        """The statistics of a cast of x: into `data` (its rowwise copy), or,
        data None, into `columnwise_data`; scale_inv the copy's float32 [1]
        scale_inv or its block scales (scaling_mode "block_1x128" /
        "block_128x128"). numel: the elements to count (x's unless given:
        x may hold padding rows of zeros, which add nothing)."""
        name = self._open(gemm)
        if name is None or role not in self._records.roles:
            return
        columnwise = data is None
        stats = _ops.cast_statistics(x.detach(), columnwise_data if columnwise else data,
                                     scale_inv, scaling_mode, columnwise)
        per_tensor = scaling_mode == "per_tensor"
        self._records.casts.append(_Cast(name, role, x.numel() if numel is None else numel,
                                         tuple(stats), scale_inv if per_tensor else None))

    def linear_statistics(self, gemm: str, tokens: int,
                          weight: torch.Tensor) -> Optional[torch.Tensor]:
        """The statistics rows for one C++ Linear call of `tokens` rows
        (None: not wanted)."""
        name = self._open(gemm)
        if name is None:
            return None
        rows = torch.zeros((ext.NUM_SLOTS, len(_COLUMNS)), dtype=torch.float32,
                           device=weight.device)
        out_features, in_features = weight.shape
        self._records.linear_calls.append(_LinearCall(
            name, (tokens * in_features, weight.numel(), tokens * out_features), rows))
        return rows


