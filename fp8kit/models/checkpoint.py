"""What both frameworks' checkpoints record besides tensors: the run's
configuration, checked on load so that a checkpoint is never resumed into
a different model, schedule or recipe."""

from __future__ import annotations

import dataclasses
import enum
import os

FORMAT = 1


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
