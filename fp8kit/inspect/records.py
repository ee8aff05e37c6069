"""One logged step of FP8 cast statistics, as both frameworks' collectors
hand it to the writers and as the JSON lines file holds it, and that
file's encoding and reader.

A tensor is named by the FP8 GEMM operand it is: `layer` (the module's
qualified name in PyTorch, e.g. "layers.0.attn.qkv", with ".fc1" / ".fc2"
appended for the two GEMMs of a LayerNormMLP; the state's path in JAX) and
`role`, one of ROLES. One line of the file is one logged step:

    {"step": 10, "framework": "torch", "recipe": "DelayedScaling",
     "tensors": {"layers.0.mlp.fc1/input": {"amax": ..., "scale": ...,
                 "numel": ..., "underflow": ..., "saturated": ...,
                 "underflow_rate": ..., "saturation_rate": ...,
                 "relative_error": ...}, ...}}

`scale` is the per-tensor scale the cast used (None under block scaling,
whose scales are per block); relative_error is sqrt(error_sq / norm_sq)
(None when norm_sq is 0: no signal). Framework-free: the collectors turn
their device values into Python numbers at the logged steps only.

JSON has no NaN or infinity: a non-finite number is written as the string
"nan", "inf" or "-inf" (encode_line), and read_run turns those strings
back into floats, so every line is valid JSON that any reader parses.
"""

from __future__ import annotations

import dataclasses
import json
import math
import operator
import os

ROLES = ("input", "weight", "grad_output")
# The per-tensor values that the plots, the summary and TensorBoard show.
METRICS = ("amax", "scale", "underflow_rate", "saturation_rate", "relative_error")
# A record's keys, and the JSON types each holds.
_RECORD_KEYS = {"step": int, "framework": str, "recipe": str, "tensors": dict}
_JSON_NAMES = {int: "integer", str: "string", dict: "object"}
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


@dataclasses.dataclass(frozen=True)
class TensorStats:
    """The statistics of one cast of one logged step (host numbers)."""

    layer: str
    role: str
    amax: float
    scale: float | None
    numel: int
    underflow: int
    saturated: int
    error_sq: float
    norm_sq: float

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"TensorStats: role {self.role!r} is not one of {ROLES}")

    @property
    def name(self) -> str:
        return f"{self.layer}/{self.role}"

    @property
    def underflow_rate(self) -> float:
        return self.underflow / self.numel if self.numel else 0.0

    @property
    def saturation_rate(self) -> float:
        return self.saturated / self.numel if self.numel else 0.0

    @property
    def relative_error(self) -> float | None:
        if not self.norm_sq > 0.0:
            return None
        return math.sqrt(self.error_sq / self.norm_sq)

    def to_json(self) -> dict:
        return {"amax": self.amax, "scale": self.scale, "numel": self.numel,
                "underflow": self.underflow, "saturated": self.saturated,
                "underflow_rate": self.underflow_rate, "saturation_rate": self.saturation_rate,
                "relative_error": self.relative_error}


def step_record(step: int, framework: str, recipe: str, tensors: list[TensorStats]) -> dict:
    """The JSON object of one logged step (one line of the file)."""
    return {"step": int(step), "framework": framework, "recipe": recipe,
            "tensors": {t.name: t.to_json() for t in tensors}}


def encode_line(record: dict) -> str:
    """A record as one line of the file (no newline): compact JSON with each
    non-finite float written as "nan", "inf" or "-inf". NumPy scalars become
    Python numbers; TypeError for a value that is no number, string, None,
    list or dict."""
    return json.dumps(_encodable(record), allow_nan=False, separators=(",", ":"))


def _encodable(value):
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        value = float(value)
        if math.isfinite(value):
            return value
        return "nan" if math.isnan(value) else "inf" if value > 0 else "-inf"
    if isinstance(value, dict):
        return {str(k): _encodable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encodable(v) for v in value]
    if hasattr(value, "__index__"):  # NumPy integers
        try:
            return operator.index(value)
        except TypeError:
            pass
    if hasattr(value, "__float__"):  # NumPy floats
        return _encodable(float(value))
    raise TypeError(f"encode_line: {type(value).__name__} {value!r} is not a number")


def decode_line(line: str) -> dict:
    """The record of one line of the file, non-finite numbers restored as
    floats; ValueError saying what is wrong with a line that is not one."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(record, dict):
        raise ValueError(f"a JSON {type(record).__name__}, not an object")
    for key, kind in _RECORD_KEYS.items():
        if key not in record:
            raise ValueError(f"no {key!r}")
        value = record[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValueError(f"{key!r} is {value!r}, not a JSON {_JSON_NAMES[kind]}")
    for name, fields in record["tensors"].items():
        if not isinstance(fields, dict):
            raise ValueError(f"tensor {name!r}: {fields!r} is not an object")
        for field, value in fields.items():
            if isinstance(value, str) and value in _NON_FINITE:
                fields[field] = _NON_FINITE[value]
            elif not (value is None or isinstance(value, (int, float))) or \
                    isinstance(value, bool):
                raise ValueError(f"tensor {name!r}: {field!r} is {value!r}, not a number, "
                                 "null or one of \"nan\", \"inf\", \"-inf\"")
    return record


def read_run(path: str | os.PathLike) -> list[dict]:
    """The records of a file that StatsLog wrote, in the file's order (a
    step logged twice, by a run resumed from a checkpoint, appears twice:
    fp8kit.inspect.history keeps the later one). Blank lines are skipped,
    and so are lines starting with '#' (the header naming the run that
    scripts/publish_results.py puts on a published file). ValueError
    naming the file and the line for a line that is no record; OSError
    when the file cannot be read."""
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip() or line.startswith("#"):
                continue
            try:
                records.append(decode_line(line))
            except ValueError as e:
                hint = ("" if line.endswith("\n") else
                        " (the last line, unfinished: the run may have stopped while writing "
                        "it; delete it to read the others)")
                raise ValueError(f"{os.fspath(path)}:{number}: not a step record: {e}{hint}") \
                    from None
    return records
