"""What fp8kit.torch.inspect gives the layers at a logged step, and how
their device values become one step's TensorStats.

A layer being inspected holds a LayerRecorder in `_fp8_inspect` (the
layers' class attribute is None: not inspected). Its calls:

    linear_statistics(gemm, tokens, weight)
        the rows that one GEMM's C++ forward and backward fill beside their
        own casts, on the device (every cast of every recipe runs in the
        C++ Linear steps: ext.linear_forward's `statistics`, the fused
        layers' steps', the block-scaled ops'), or, for GroupedLinear
        (weight [E, out, in]), that its grouped casts fill, merged over
        the experts (fp8kit/torch/_grouped_statistics.py);
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

_COLUMNS = {name: i for i, name in enumerate(ext.STATISTICS_COLUMNS)}
_ROLE_SLOTS = ((ROLES[0], ext.SLOT_INPUT), (ROLES[1], ext.SLOT_WEIGHT),
               (ROLES[2], ext.SLOT_GRAD_OUTPUT))


def refuse_tracing_error() -> RuntimeError:
    return RuntimeError(
        "fp8kit.torch.inspect: an inspected layer is being traced by torch.compile or "
        "torch.export; inspection runs eagerly only. Inspect the eager model (close the "
        "handle, or leave its `with` block, before compiling), or compile without inspection")


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
        self.linear_calls: list = []
        self.closed = False  # handed to the host: later records are dropped

    def to_host(self) -> "HostCopy":
        """Packs the step's values (one tensor per device) and starts their
        copy to the host; no wait."""
        self.closed = True
        by_device: dict = {}
        for call in self.linear_calls:
            by_device.setdefault(call.rows.device, []).append(call)
        parts = [_Packed(calls) for calls in by_device.values()]
        return HostCopy(self.step, sorted(self.recipes), parts, self.roles)


class _Packed:
    """One device's rows of a step in one float32 tensor, copied to the
    host."""

    def __init__(self, calls: list):
        self.calls = calls
        packed = torch.stack([call.rows for call in calls]).view(-1)
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
        rows = values.reshape(len(self.calls), ext.NUM_SLOTS, len(_COLUMNS))
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


def _scale(scale_inv) -> Optional[float]:
    """The per-tensor scale a cast used: 1 / its float32 scale_inv; None
    for a block-scaled cast (scale_inv NaN: no one scale)."""
    if np.isnan(scale_inv):
        return None
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

    def linear_statistics(self, gemm: str, tokens: int,
                          weight: torch.Tensor) -> Optional[torch.Tensor]:
        """The statistics rows for one C++ Linear call of `tokens` rows
        (None: not wanted)."""
        name = self._open(gemm)
        if name is None:
            return None
        rows = torch.zeros((ext.NUM_SLOTS, len(_COLUMNS)), dtype=torch.float32,
                           device=weight.device)
        out_features, in_features = weight.shape[-2:]
        self._records.linear_calls.append(_LinearCall(
            name, (tokens * in_features, weight.numel(), tokens * out_features), rows))
        return rows


