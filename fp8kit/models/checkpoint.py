"""What both frameworks' checkpoints share: the run's configuration,
checked on load so that a checkpoint is never resumed into a different
model, schedule or recipe, and which file format a checkpoint is in, so
that one trainer's file handed to the other is named as such.

Both formats are zip archives: np.savez writes one "NAME.npy" member per
array (JaxTrainer), torch.save one folder holding "data.pkl" and the
tensors' storages (TorchTrainer).
"""

from __future__ import annotations

import dataclasses
import enum
import os
import zipfile

FORMAT = 1
NPZ = "a NumPy .npz archive (JaxTrainer.save's format)"
TORCH = "a PyTorch checkpoint (torch.save's zip archive, TorchTrainer.save's format)"
PICKLE = "a pickle (torch.save's legacy format, or another pickle)"
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")  # a local file header; an empty archive's end
_NPY_MAGIC = b"\x93NUMPY"
_PICKLE_MAGIC = b"\x80"  # the protocol opcode; torch.save's legacy format is a pickle


def file_format(path) -> str:
    """NPZ, TORCH, or what else the file at `path` is, in words."""
    with open(path, "rb") as f:
        head = f.read(8)
    if head.startswith(_NPY_MAGIC):
        return "a single NumPy array (np.save's .npy), not an archive"
    if head.startswith(_PICKLE_MAGIC):
        return PICKLE
    if not head.startswith(_ZIP_MAGIC):
        return f"not a zip archive (it starts with {head!r})"
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except zipfile.BadZipFile as e:
        return f"a damaged zip archive ({e})"
    if names and all(n.endswith(".npy") for n in names):
        return NPZ
    if any(n.endswith("/data.pkl") for n in names):
        return TORCH
    return f"a zip archive of neither trainer's layout (members {names[:3]})"


def check_file_format(path, accepted: tuple[str, ...], reader: str, other: str) -> None:
    """ValueError unless the file at `path` is in one of the `accepted`
    formats (the first is what `reader` writes): it names the file, what
    it is and what was expected, and `other`, the reader of the other
    trainer's format, when it is that."""
    found = file_format(path)
    if found in accepted:
        return
    hint = f" Load it with {other}." if found in (NPZ, TORCH) else ""
    raise ValueError(f"checkpoint {os.fspath(path)} is {found}; {reader} reads {accepted[0]}."
                     f"{hint}")


def run_description(model_cfg, train_cfg, recipe) -> dict:
    """Plain values (str, int, float) naming the run's configuration."""
    def plain(obj):
        if obj is None:
            return None
        d = {k: (v.value if isinstance(v, enum.Enum) else v)
             for k, v in dataclasses.asdict(obj).items()}
        return {"type": type(obj).__name__, **d}
    return {"model": plain(model_cfg), "train": plain(train_cfg), "recipe": plain(recipe)}


def check_compatible(saved: dict, current: dict, path) -> None:
    """ValueError naming every setting in which `saved` differs from `current`."""
    diffs = []
    for part in ("model", "train", "recipe"):
        a, b = saved.get(part), current[part]
        if a == b:
            continue
        if a is None or b is None:
            diffs.append(f"{part}: saved {a}, now {b}")
            continue
        diffs += [f"{part}.{k}: saved {a.get(k)!r}, now {b.get(k)!r}"
                  for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    if diffs:
        raise ValueError(f"checkpoint {os.fspath(path)} was written by a different run; "
                         f"resume it with the same settings ({'; '.join(diffs)})")


def check_format(fmt, path) -> None:
    if fmt != FORMAT:
        raise ValueError(f"checkpoint {os.fspath(path)} has format {fmt!r}; this fp8kit reads "
                         f"format {FORMAT}")


def replace_atomically(write, path) -> None:
    """write(file object) into path + '.tmp', then rename over path: a
    crash mid-save never leaves a truncated checkpoint behind."""
    tmp = os.fspath(path) + ".tmp"
    with open(tmp, "wb") as f:
        write(f)
    os.replace(tmp, path)
