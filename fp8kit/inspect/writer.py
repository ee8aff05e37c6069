"""StatsLog: writes the logged steps' cast statistics to a JSON lines file
(the format of fp8kit.inspect.records) and, optionally, to TensorBoard."""

from __future__ import annotations

import collections
import importlib
import operator
import os
import pathlib

from fp8kit.inspect.records import METRICS, TensorStats, encode_line, step_record

# TensorBoard summary writers, in the order they are tried: (module, class).
# Each takes the log directory as its first argument and has
# add_scalar(tag, value, step), flush() and close(). torch.utils.tensorboard
# is left out: it wraps the tensorboard package, which is tried first, and
# fp8kit.inspect imports no framework.
TENSORBOARD_WRITERS = (("tensorboard.summary", "Writer"), ("tensorboardX", "SummaryWriter"))


def _positive_int(value, what: str) -> int:
    """`value` as an int >= 1; ValueError naming `what` otherwise (a bool or
    a float is no int here)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise ValueError(f"{what}={value!r}: expected an int >= 1, not a "
                         f"{type(value).__name__} (log every N-th step, e.g. {what}=100)")
    value = operator.index(value)
    if value < 1:
        raise ValueError(f"{what}={value}: expected an int >= 1 (every=1 logs every step)")
    return value


def _step(step, method: str) -> int:
    if isinstance(step, bool) or not hasattr(step, "__index__") or operator.index(step) < 0:
        raise ValueError(f"StatsLog.{method}: step={step!r}: expected an int >= 0")
    return operator.index(step)


def summary_writer_class():
    """The first importable class of TENSORBOARD_WRITERS; ImportError saying
    what to install when there is none."""
    for module, name in TENSORBOARD_WRITERS:
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    raise ImportError("StatsLog(tensorboard=...): no TensorBoard summary writer is installed: "
                      "pip install tensorboard (or tensorboardX), or pass tensorboard=None")


class StatsLog:
    """Writes one JSON line per logged step to `path` and, when
    `tensorboard` names a log directory, the scalars
    `<layer>/<role>/<metric>` for each metric of METRICS there too.

    every: log the steps that are multiples of it, step 0 included (an int
        >= 1; ValueError otherwise). should_log(step) says which; write()
        itself writes any step it is given.
    tensorboard: a log directory, or None for the JSON file only.
        ImportError at construction when no TensorBoard writer is installed.
    append: False starts a new file (an existing one is replaced); True
        continues one, for a run resumed from a checkpoint (a step it logs
        again replaces the earlier line's values when the file is read).

    Each write() is flushed, so a run that crashes keeps the steps it
    logged. A context manager; close() closes both outputs. In a
    distributed run, log from one rank, or give each rank its own path.
    """

    def __init__(self, path: str | os.PathLike, every: int, tensorboard: str | os.PathLike |
                 None = None, append: bool = False):
        self.every = _positive_int(every, "every")
        self.path = pathlib.Path(path)
        writer_class = summary_writer_class() if tensorboard is not None else None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a" if append else "w", encoding="utf-8", newline="\n")
        self._tensorboard = None
        if writer_class is not None:
            try:
                self._tensorboard = writer_class(os.fspath(tensorboard))
            except BaseException:
                self._file.close()
                raise

    def should_log(self, step: int) -> bool:
        """True at the steps that are multiples of `every` (0, N, 2N, ...);
        ValueError for a step that is not an int >= 0."""
        return _step(step, "should_log") % self.every == 0

    def write(self, step: int, framework: str, recipe: str, tensors: list[TensorStats]) -> dict:
        """Appends the record of one logged step (step_record) as a line of
        the file, flushed, and its scalars to TensorBoard; returns the
        record. `framework`: "torch" or "jax"; `recipe`: the recipe's name
        (e.g. "DelayedScaling"). ValueError for a closed log, a step that
        is not an int >= 0, a tensor that is no TensorStats or a name
        given twice."""
        if self._file is None:
            raise ValueError(f"StatsLog({os.fspath(self.path)!r}) is closed")
        step = _step(step, "write")
        tensors = list(tensors)
        for t in tensors:
            if not isinstance(t, TensorStats):
                raise ValueError(f"StatsLog.write: tensors holds a {type(t).__name__}, not a "
                                 "TensorStats")
        counts = collections.Counter(t.name for t in tensors)
        twice = sorted(n for n, c in counts.items() if c > 1)
        if twice:
            raise ValueError(f"StatsLog.write: step {step}: tensors named twice: {twice}")
        record = step_record(step, framework, recipe, tensors)
        self._file.write(encode_line(record) + "\n")
        self._file.flush()
        if self._tensorboard is not None:
            for name, fields in record["tensors"].items():
                for metric in METRICS:
                    if fields[metric] is not None:
                        self._tensorboard.add_scalar(f"{name}/{metric}", float(fields[metric]),
                                                     record["step"])
            self._tensorboard.flush()
        return record

    def close(self) -> None:
        """Closes the file and the TensorBoard writer; a second call does
        nothing."""
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> StatsLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
