"""fp8kit.torch.inspect: what the FP8 casts of a model's fp8kit layers
lose, per layer and tensor, logged every N training steps, with no change
to the model.

    handle = fp8kit.torch.inspect(model, every=100, log="fp8_stats.jsonl")
    for x, y in batches:                      # one root forward: one step
        with fp8kit.torch.autocast(recipe=DelayedScaling()):
            loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
    handle.close()                            # writes the last logged step

or `with fp8kit.torch.inspect(model, ...) as handle:` around the loop. The
file is fp8kit.inspect's (docs/inspect.md): `python -m fp8kit.inspect
summary fp8_stats.jsonl` ranks the casts that lose most, `... plot` draws
them; `log` may also be a StatsLog of your own (TensorBoard scalars too).

What is recorded. Every FP8 GEMM of the model's fp8kit layers
(fp8kit.torch.Linear, LayerNormLinear and GroupedLinear: one; LayerNormMLP:
fc1 and fc2) casts three operands: its input and its weight in the
forward, its output gradient in the backward (roles "input", "weight",
"grad_output"). At a logged step each cast reports the statistics of
fp8kit.torch.cast_statistics, computed from the high-precision tensor and
the FP8 copy the layer's own cast wrote (nothing is quantized again), on
the device and without waiting for it, for delayed, current and block
scaling alike; the scale the cast used (1 / its scale_inv; None under block
scaling, whose scales are per block, and for GroupedLinear, whose experts
each have their own: its row merges the experts' casts, amax the largest,
counts and sums added); and the element count (without the zero rows block
scaling pads the tokens with). Under block scaling GroupedLinear reads
counts that are on the GPU back to the host at a logged step (a wait), to
find each expert's rows and block scales. Where the high-precision
operand of a fused cast (the normalization's output, the activation's, the
activation's gradient) is not otherwise kept, the kernel writes it beside
the FP8 copy in the same pass at a logged step, in the layer's dtype: in a
bfloat16 layer the value cast, rounded to bfloat16. A weight that is
already FP8 (FSDP2's FP8 all-gather) had no cast in the layer and reports
nothing.

Every GEMM's casts run inside the C++ Linear steps (fp8kit.torch.Linear's
one call, the fused layers' steps, the block-scaled ops). At a logged step
those same calls also fill a small statistics buffer beside each of their
casts, from the copies they wrote (ext.linear_forward's `statistics`;
torch_ext/linear_autograd.h): the exact copies, and nothing else changes.

Steps. A step is one forward of the root module (the model given) with
gradients enabled; a forward pre-hook on it counts them from 0, and steps
0, every, 2 * every, ... are logged. Forwards under torch.no_grad or
torch.inference_mode (evaluation) neither count nor are recorded. With
gradient accumulation (several forwards per optimizer step), or to number
steps as a resumed run does, call handle.step(n) before each step's
forwards: steps are then what step() says, and every forward of a logged
step is recorded, its casts merged per tensor (amax the max; counts, sums
and numel added; scale that of the first). Only calls made within the root
module's forward (and their backward) are recorded.

Cost. Not inspected: nothing (a layer checks that it holds no recorder).
Inspected, between logged steps: that check, and the root hooks' few
Python operations. At a logged step: one statistics pass per cast, queued
on the device; the step's values are packed into one tensor per device and
copied to the host once, without a wait, when the next step starts (or at
flush() or close()), and written (StatsLog.write: one JSON line) once that
copy is done. A logged step whose forward ran no FP8 cast in the inspected
layers (outside fp8kit.torch.autocast) writes nothing and warns once.

Names: each layer's qualified name in model.named_modules(), with ".fc1" /
".fc2" for LayerNormMLP's GEMMs; an fp8kit layer given as the model itself
is named by its class. `layers` picks some with fnmatch patterns matched
against those names (a LayerNormMLP's module name picks both GEMMs),
`roles` some roles, and `names` renames them as written.

Eager mode only: inspect() refuses a compiled model, and an inspected layer
that torch.compile or torch.export traces raises. With inspection off
nothing of the layers changes, so compiled, FSDP2 and DDP models are
unaffected. A DDP or FSDP2 model inspected eagerly records each rank's own
casts (its root is the wrapper: names start with "module." under DDP);
inspect on one rank, or give each rank its own log. One handle per layer
at a time.
"""

from __future__ import annotations

import fnmatch
import os
import warnings
import weakref
from typing import Callable, Iterable, Optional, Union

import torch

from fp8kit.inspect.records import ROLES
from fp8kit.inspect.writer import StatsLog
from fp8kit.torch._cast_records import LayerRecorder, StepRecords, refuse_tracing_error
from fp8kit.torch._fused_module import FusedLayer
from fp8kit.torch.grouped_linear import GroupedLinear
from fp8kit.torch.linear import Linear

_FN = "fp8kit.torch.inspect"
# Each inspected layer's handle: one at a time.
_HANDLES: "weakref.WeakKeyDictionary[torch.nn.Module, Inspection]" = weakref.WeakKeyDictionary()


def inspect(model: torch.nn.Module, every: Optional[int] = None, log=None, *, tensorboard=None,
            append: bool = False, layers: Union[str, Iterable[str], None] = None,
            roles: Optional[Iterable[str]] = None,
            names: Optional[Callable[[str], str]] = None) -> "Inspection":
    """Starts logging the FP8 cast statistics of `model`'s fp8kit layers
    every `every` steps (the module docstring says what and when).

    model: the root module of the training step (its forwards count the
    steps). log: where the statistics go: a path, for which the handle
    opens an fp8kit.inspect.StatsLog(log, every, tensorboard, append)
    (every: an int >= 1, default 100; tensorboard: a log directory for
    TensorBoard scalars too; append: continue the file of a resumed run)
    and closes it with itself; or a StatsLog of your own, whose `every`
    (leave `every` out, or give the same) and outputs are used, and which
    stays open. layers: fnmatch patterns of the layers to inspect
    (default: all). roles: some of "input", "weight", "grad_output"
    (default: all). names: a function from a GEMM's name as fp8kit names it
    to the name to write (default: as it is).

    Returns the Inspection handle, active at once: close() it, or use it as
    a context manager, to stop.
    """
    return Inspection(model, every, log, tensorboard, append, layers, roles, names)


class Inspection:
    """A running inspection (fp8kit.torch.inspect returns it)."""

    def __init__(self, model, every, log, tensorboard, append, layers, roles, names):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"{_FN}: model must be a torch.nn.Module, got {type(model).__name__}")
        if every is not None and (isinstance(every, bool) or not isinstance(every, int)
                                  or every <= 0):
            raise ValueError(f"{_FN}: every={every!r} must be an int >= 1 (log every N-th "
                             "step, e.g. every=100; every=1 logs every step)")
        given_log = isinstance(log, StatsLog)
        if given_log and (tensorboard is not None or append
                          or every not in (None, log.every)):
            raise ValueError(f"{_FN}: log is a StatsLog, which has its own every "
                             f"({log.every}), tensorboard and append; leave those out (or pass "
                             "a path as log)")
        if not given_log and not isinstance(log, (str, os.PathLike)):
            raise TypeError(f"{_FN}: log must be a path for the JSON lines (e.g. "
                            "log='fp8_stats.jsonl') or an fp8kit.inspect.StatsLog, got "
                            f"{type(log).__name__}")
        _check_eager(model)
        self._roles = _check_roles(roles)
        self._targets = _targets(model, layers, names)  # [(module, {gemm: name})], in order
        self._order = {name: i for i, name in
                       enumerate(n for _, names in self._targets for n in names.values())}
        taken = [names for m, names in self._targets if m in _HANDLES]
        if taken:
            raise RuntimeError(f"{_FN}: layer {next(iter(taken[0].values()))!r} is already "
                               "inspected by another handle; close that one first "
                               "(handle.close(), or leave its `with` block)")
        self._log = log if given_log else StatsLog(log, every or 100, tensorboard, append)
        self._owns_log = not given_log
        self.every = self._log.every
        for m, _ in self._targets:
            _HANDLES[m] = self
        self._step = 0           # the step of the next forward (or step()'s)
        self._manual = False     # step() was called: forwards no longer count
        self._records: Optional[StepRecords] = None  # the logged step being recorded
        self._attached = False
        self._copies: list = []  # HostCopy of finished steps, oldest first
        self._warned_empty = False
        self._closed = False
        self.last: Optional[list] = None  # the TensorStats of the last step written
        self._hooks = (model.register_forward_pre_hook(self._pre_forward),
                       model.register_forward_hook(self._post_forward, always_call=True))

    # ------------------------------------------------------------ public
    def step(self, n: int) -> None:
        """The forwards that follow belong to step n (from now on forwards
        no longer count steps themselves). Writes what earlier steps left."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"{_FN}: step(n) takes the training step, an int >= 0; got {n!r}")
        self._check_open("step")
        if self._records is not None and self._records.step != n:
            self._finish()
        self._manual = True
        self._step = n
        self._write_ready()

    def flush(self) -> None:
        """Writes every logged step recorded so far, waiting for the device;
        call it after the step's backward."""
        self._finish()
        while self._copies:
            self._write(self._copies.pop(0))

    def close(self) -> None:
        """flush(), then stops: the hooks and the layers' recorders go."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            self._detach()
            for h in self._hooks:
                h.remove()
            for m, _ in self._targets:
                if _HANDLES.get(m) is self:
                    del _HANDLES[m]
            if self._owns_log:
                self._log.close()

    def __enter__(self) -> "Inspection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def layers(self) -> list:
        """The names of the inspected GEMMs, in the model's order."""
        return list(self._order)

    # ------------------------------------------------------------ hooks
    def _pre_forward(self, module, args) -> None:
        self._write_ready()
        if not torch.is_grad_enabled():
            return
        if torch.compiler.is_compiling():
            raise refuse_tracing_error()
        step = self._step
        if not self._manual:
            self._finish()
            self._step += 1
        if not self._log.should_log(step):
            return
        if self._records is None:
            self._records = StepRecords(step, self._roles)
        for m, names in self._targets:
            m._fp8_inspect = LayerRecorder(self._records, names)
        self._attached = True

    def _post_forward(self, module, args, output) -> None:
        self._detach()

    # ------------------------------------------------------------ internals
    def _detach(self) -> None:
        if self._attached:
            for m, _ in self._targets:
                m.__dict__.pop("_fp8_inspect", None)
            self._attached = False

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise RuntimeError(f"{_FN}: {what}() on a closed handle; start a new one with "
                               "fp8kit.torch.inspect(model, ...)")

    def _finish(self) -> None:
        """The step being recorded is done: start its copy to the host."""
        records, self._records = self._records, None
        if records is None:
            return
        if records.linear_calls:
            self._copies.append(records.to_host())
        else:
            self._warn_empty(records.step)

    def _write_ready(self) -> None:
        while self._copies and self._copies[0].ready():
            self._write(self._copies.pop(0))

    def _write(self, copy) -> None:
        tensors = sorted(copy.tensor_stats(),
                         key=lambda t: (self._order.get(t.layer, 0), ROLES.index(t.role)))
        if not tensors:
            self._warn_empty(copy.step)
            return
        self.last = tensors
        self._log.write(copy.step, "torch", "+".join(copy.recipes), tensors)

    def _warn_empty(self, step: int) -> None:
        if not self._warned_empty:
            self._warned_empty = True
            warnings.warn(f"{_FN}: logged step {step} ran no FP8 cast in the inspected layers, "
                          "so nothing was written for it; are they called inside "
                          "fp8kit.torch.autocast?", stacklevel=3)


def _check_eager(model: torch.nn.Module) -> None:
    compiled = [name for name, m in model.named_modules()
                if getattr(m, "_compiled_call_impl", None) is not None]
    if isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
        compiled.insert(0, "the model")
    if compiled:
        raise ValueError(f"{_FN}: {compiled[0] or 'the model'} is compiled (torch.compile), and "
                         "inspection runs eagerly only; inspect the model before compiling it "
                         "(model, not torch.compile(model)) and run it eagerly while inspected")


def _check_roles(roles) -> frozenset:
    if roles is None:
        return frozenset(ROLES)
    picked = [roles] if isinstance(roles, str) else list(roles)
    unknown = [r for r in picked if r not in ROLES]
    if unknown or not picked:
        raise ValueError(f"{_FN}: roles={roles!r}; name some of {list(ROLES)} (or leave roles "
                         "out for all three)")
    return frozenset(picked)


def _targets(model: torch.nn.Module, layers, names) -> list:
    """[(layer module, {gemm: the GEMM's name to write})] of the fp8kit
    layers `layers` picks, in named_modules() order."""
    found = []
    for name, m in model.named_modules():
        if isinstance(m, (Linear, GroupedLinear)) or (isinstance(m, FusedLayer)
                                                     and len(m._GEMMS) == 1):
            found.append((m, name, {"": name or type(m).__name__}))
        elif isinstance(m, FusedLayer):
            base = f"{name}." if name else f"{type(m).__name__}."
            found.append((m, name, {g: base + g for g in m._GEMMS}))
    if not found:
        raise ValueError(f"{_FN}: {type(model).__name__} holds no fp8kit FP8 layer "
                         "(fp8kit.torch.Linear, LayerNormLinear, LayerNormMLP or GroupedLinear), "
                         "so there is nothing to inspect; build the model with fp8kit's layers")
    picked = [(m, gemms) for m, _, gemms in found] if layers is None else \
        _pick(found, layers)
    if names is None:
        return picked
    if not callable(names):
        raise TypeError(f"{_FN}: names must be a function from a layer's name to the name to "
                        f"write (e.g. a dict's __getitem__), got {type(names).__name__}")
    renamed = [(m, {g: names(full) for g, full in gemms.items()}) for m, gemms in picked]
    written = [n for _, gemms in renamed for n in gemms.values()]
    bad = [n for n in written if not isinstance(n, str) or not n]
    if bad or len(set(written)) < len(written):
        what = f"gives {bad[0]!r}" if bad else "gives two GEMMs one name"
        raise ValueError(f"{_FN}: names {what}; it must give each inspected GEMM a name of its "
                         "own (a non-empty str)")
    return renamed


def _pick(found: list, layers) -> list:
    """The GEMMs of `found` that the patterns `layers` match (by their own
    name or their module's); ValueError for a pattern matching none."""
    patterns = [layers] if isinstance(layers, str) else list(layers)
    if not patterns or not all(isinstance(p, str) for p in patterns):
        raise TypeError(f"{_FN}: layers={layers!r} must be a pattern or a list of fnmatch "
                        "patterns of layer names, e.g. layers=['layers.0.*']")
    picked, used = [], set()
    for m, name, gemms in found:
        keep = {}
        for g, full in gemms.items():
            hits = {p for p in patterns if fnmatch.fnmatchcase(full, p)
                    or (name and fnmatch.fnmatchcase(name, p))}
            if hits:
                keep[g] = full
                used |= hits
        if keep:
            picked.append((m, keep))
    unused = [p for p in patterns if p not in used]
    if unused:
        known = [full for _, _, gemms in found for full in gemms.values()]
        shown = ", ".join(repr(n) for n in known[:8]) + (", ..." if len(known) > 8 else "")
        raise ValueError(f"{_FN}: layers pattern {unused[0]!r} matches no fp8kit layer of the "
                         f"model; its layers are {shown}")
    return picked
