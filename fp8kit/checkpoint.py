"""Portable checkpoints: named arrays and their metadata in one safetensors
file, which PyTorch, NumPy and JAX all read, so that a run saved by one
framework resumes in the other.

    fp8kit.checkpoint.save(path, arrays, metadata)
    arrays, metadata = fp8kit.checkpoint.load(path)

`arrays` maps names to NumPy arrays (float32 weights, optimizer moments,
FP8 scaling states, integer counters); `metadata` is a dict of JSON
values. The file is a plain safetensors file: any safetensors reader
opens it. fp8kit adds, in the file's metadata, its format tag, the
metadata as JSON and a CRC-32 of every array, so that a file damaged after
it was written is named with the array it hits instead of being trained on.

An FP8 scaling state (delayed scaling) is saved as the same three arrays
in both frameworks, per Linear (STATE_FIELDS): amax_history float32
[3, amax_history_len] (column 0 the newest amax), scale float32 [3] and
seeded float32 [3] (0.0 fresh, 1.0 seeded), rows in slot order input,
weight, gradient of the output. scale_inv is not saved: it is 1 / scale,
which the loader recomputes exactly (an IEEE float32 division, as the core
does).
"""

from __future__ import annotations

import json
import os
import zipfile
import zlib
from typing import Mapping

import numpy as np

FORMAT = "fp8kit-checkpoint-1"
STATE_FIELDS = ("amax_history", "scale", "seeded")
# What each field's values may be (fp8kit.jax checks its states by these
# rules; the PyTorch extension applies the same to a Linear's saved state):
# an amax is a max of |x| (NaN and +inf are amaxes of tensors that held
# them, which the update skips), every cast multiplies by the scale, and
# seeded is a flag kept as float32.
STATE_RULES = {
    "amax_history": (">= 0 (NaN and inf allowed)", lambda v: ~(v < 0)),
    "scale": ("finite and > 0", lambda v: np.isfinite(v) & (v > 0)),
    "seeded": ("0.0 (fresh) or 1.0 (seeded)", lambda v: (v == 0) | (v == 1)),
}
_TAG, _META, _CRC = "fp8kit.format", "fp8kit.metadata", "fp8kit.crc32"


def _safetensors():
    try:
        import safetensors
        import safetensors.numpy
    except ImportError:
        raise ImportError("fp8kit.checkpoint needs the safetensors package: "
                          "pip install safetensors") from None
    return safetensors


def _crc(a: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(a).view(np.uint8).reshape(-1))


def save(path, arrays: Mapping[str, np.ndarray], metadata: Mapping) -> None:
    """Writes `arrays` and `metadata` to `path` atomically (into path +
    '.tmp', then renamed over path: a crash mid-save leaves the previous
    file whole)."""
    st = _safetensors()
    arrays = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
    header = {_TAG: FORMAT, _META: json.dumps(dict(metadata), sort_keys=True),
              _CRC: json.dumps({k: _crc(v) for k, v in arrays.items()}, sort_keys=True)}
    tmp = os.fspath(path) + ".tmp"
    st.numpy.save_file(arrays, tmp, metadata=header)
    os.replace(tmp, path)


def load(path) -> tuple[dict[str, np.ndarray], dict]:
    """(arrays, metadata) of a file save() wrote; ValueError naming the
    file and what is wrong with it otherwise (another format, truncated,
    damaged: the array whose bytes changed)."""
    st = _safetensors()
    path = os.fspath(path)
    try:
        with st.safe_open(path, framework="np") as f:
            header = f.metadata() or {}
            arrays = {k: f.get_tensor(k) for k in f.keys()}
    except st.SafetensorError as e:
        raise ValueError(f"checkpoint {path} is not a whole safetensors file ({e}); it is "
                         f"{describe(path)}") from None
    if header.get(_TAG) != FORMAT:
        raise ValueError(f"checkpoint {path} is a safetensors file without fp8kit's format tag "
                         f"{FORMAT!r} (it has {header.get(_TAG)!r}): it was not written by "
                         "fp8kit.checkpoint.save")
    crcs = json.loads(header[_CRC])
    if sorted(crcs) != sorted(arrays):
        raise ValueError(f"checkpoint {path} is damaged: it holds arrays "
                         f"{sorted(set(arrays) ^ set(crcs))[:5]} that its list of arrays "
                         "does not match")
    for name, a in arrays.items():
        if _crc(a) != crcs[name]:
            raise ValueError(f"checkpoint {path} is damaged: the bytes of {name!r} changed "
                             "after it was written (CRC-32 mismatch); resume from another "
                             "checkpoint")
    return arrays, json.loads(header[_META])


def describe(path) -> str:
    """What the file at `path` is, in words (for errors about files that
    are not fp8kit checkpoints)."""
    with open(path, "rb") as f:
        head = f.read(8)
    if head.startswith(b"\x93NUMPY"):
        return "a NumPy .npy array"
    if head.startswith(b"\x80"):
        return "a pickle (torch.save's legacy format, or another pickle)"
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        try:
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
        except zipfile.BadZipFile:
            return "a damaged zip archive"
        if any(n.endswith("/data.pkl") for n in names):
            return "a torch.save archive (an older fp8kit TorchTrainer checkpoint?)"
        if names and all(n.endswith(".npy") for n in names):
            return "a NumPy .npz archive (an older fp8kit JaxTrainer checkpoint?)"
        return "a zip archive"
    return f"a file starting with {head!r}"



def first_bad_value(field: str, values) -> tuple[float, str] | None:
    """(value, "FIELD holds X (flat index i); FIELD values must be RULE")
    for the first of `values` that breaks STATE_RULES[field], else None."""
    v = np.asarray(values, np.float32).ravel()
    rule, ok = STATE_RULES[field]
    bad = np.flatnonzero(~ok(v))
    if not bad.size:
        return None
    i = int(bad[0])
    return float(v[i]), (f"{field} holds {float(v[i]):g} (flat index {i}); {field} values "
                         f"must be {rule}")
