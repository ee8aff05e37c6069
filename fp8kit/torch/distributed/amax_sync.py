"""AmaxSync: the delayed-scaling state of a model's fp8kit layers made the
same on every rank of a data-parallel group, with one collective per step.

    sync = AmaxSync(model)            # group: the default process group
    for batch in data:
        with fp8kit.torch.autocast(recipe=DelayedScaling()):
            loss = model(batch).sum()
        loss.backward()
        pending = sync.start()        # the all-reduce runs while ...
        optimizer.step()              # ... the optimizer steps
        pending.wait()                # before the next forward

Each rank records its own amaxes during the step (its inputs, its output
gradients and, under FSDP2, its shard of each weight). sync() (= start()
then wait()) all-reduces (MAX) the amax histories of every layer in one
coalesced float32 all-reduce, so each history entry recorded since the
previous sync becomes the largest amax any rank saw (the amax of the whole
batch, of the whole weight), and then recomputes every scale from the
reduced history with the core's delayed-scaling rule
(fp8kit.torch.delayed_scaling_update): afterwards every rank holds the same
histories and bit-identical scales. A reduced history whose amax gives no
new scale (zero, NaN or inf; NaN is reduced as inf, which the rule treats
alike) keeps the scale this AmaxSync's previous sync set (1, a fresh
state's, before its first sync of that state).

The same buffer carries a signature of the layers and recipes, so ranks
that run different models or recipes all raise at once (no rank is left
waiting); a changed set of layers (a new recipe, a loaded checkpoint) is
first checked by a collective of fixed size. Current-scaling states hold no
history and take no part. Between start() and wait() the model must not
run: the reduction rewrites the layers' scaling state in place.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from fp8kit.torch import ops
from fp8kit.torch.distributed import _group

_FN = "fp8kit.torch.distributed.AmaxSync"


def layer_states(module: torch.nn.Module) -> list:
    """(name, ext.LinearState) of every fp8kit layer under `module`, in
    module order (a fused layer's GEMMs in their order), every recipe's."""
    from fp8kit.torch._fused_module import FusedLayer
    from fp8kit.torch.linear import Linear
    out = []
    for name, m in module.named_modules():
        if isinstance(m, Linear):
            out += [(name, st) for st in m.fp8_states]
        elif isinstance(m, FusedLayer):
            out += [(f"{name}.{g}", st) for g, sts in m.fp8_states.items() for st in sts]
    return out


def _slot_dtypes(recipe: dict) -> list:
    return [recipe["forward_dtype"], recipe["forward_dtype"], recipe["backward_dtype"]]


class AmaxSync:
    """Reduces the amax histories of `module`'s fp8kit layers across
    `group` (default: the default process group; nothing to do without an
    initialized torch.distributed) and recomputes their scales."""

    def __init__(self, module: torch.nn.Module, group=None) -> None:
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"{_FN}: module must be a torch.nn.Module, got "
                            f"{type(module).__name__}")
        self._module = module
        self._group = _group.resolve_group(_FN, group)
        self._checked = None   # the signature last checked across the group
        self._scales = {}      # LinearState -> the scales the previous sync set

    def sync(self) -> None:
        """start() and wait()."""
        self.start().wait()

    def start(self) -> "PendingAmaxSync":
        """Launches the all-reduce (asynchronous); wait() on the result
        writes the reduced state back."""
        if self._group is None:
            return PendingAmaxSync(self, None, [], None)
        states = layer_states(self._module)
        device = self._device(states)
        signature = _group.signature([(name, sorted(st.recipe.items())) for name, st in states])
        # Checked before anything depends on the layers, so that ranks whose
        # layers differ (even where one has no delayed-scaling state) all
        # make this collective and all raise.
        if self._checked is None or not torch.equal(self._checked, signature):
            check = signature.to(device)
            dist.all_reduce(check, op=dist.ReduceOp.MAX, group=self._group)
            _group.check_signature(_FN, check, "fp8kit layers or recipes")
            self._checked = signature
        delayed = [(name, st) for name, st in states if st.delayed]
        if not delayed:
            return PendingAmaxSync(self, None, [], None)
        # (history, scale, scale_inv) of each: the live tensors, rewritten in
        # place between steps (never while the layer's forward or backward runs).
        tensors = [(t[0], t[2], t[3]) for t in (st.tensors for _, st in delayed)]
        buffer = torch.cat([signature.to(device)] + [h.reshape(-1) for h, _, _ in tensors])
        # MAX over a NaN is order dependent in the backends; inf is not, and
        # the delayed-scaling rule treats both as "no new scale".
        buffer = torch.where(torch.isnan(buffer), torch.inf, buffer)
        work = dist.all_reduce(buffer, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
        return PendingAmaxSync(self, work, list(zip(delayed, tensors)), buffer)

    def _device(self, states: list) -> torch.device:
        """The one device of the layers' states (the collectives' device)."""
        if not states:  # nothing to reduce, but the layer check still runs
            if dist.get_backend(self._group) == "nccl":
                return torch.device("cuda", torch.cuda.current_device())
            return torch.device("cpu")
        device = states[0][1].device
        for name, st in states:
            if st.device != device:
                raise ValueError(f"{_FN}: layer {name!r} keeps its FP8 state on {st.device} but "
                                 f"{states[0][0]!r} on {device}; keep the model on one device "
                                 "per rank")
        return device

    def _write_back(self, entries: list, reduced: torch.Tensor) -> None:
        _group.check_signature(_FN, reduced[:_group.SIGNATURE_FLOATS],
                               "fp8kit layers or recipes")
        offset = _group.SIGNATURE_FLOATS
        by_config = {}  # (amax_history_len, margin, amax_reduction) -> update lists
        scales = {}
        with torch.no_grad():
            for (_, st), (history, scale, scale_inv) in entries:
                length = history.shape[1]
                reduced_history = reduced[offset:offset + history.numel()].view_as(history)
                offset += history.numel()
                # The update rolls the history by one; rolled back first, it
                # comes out as the reduced history, and the scale is the one
                # the rule gives for it (from the previous sync's scale when
                # it gives none). Entry length-1 is read before the roll.
                history.copy_(torch.roll(reduced_history, -1, dims=1))
                previous = self._scales.get(st)
                scale.copy_(previous if previous is not None else torch.ones_like(scale))
                recipe = st.recipe
                lists = by_config.setdefault(
                    (length, recipe["margin"], recipe["amax_reduction"]), ([], [], [], [], []))
                for slot, fp8 in enumerate(_slot_dtypes(recipe)):
                    lists[0].append(history[slot])
                    lists[1].append(history[slot, length - 1:])
                    lists[2].append(scale[slot:slot + 1])
                    lists[3].append(scale_inv[slot:slot + 1])
                    lists[4].append(fp8)
                scales[st] = scale
            for (_, margin, reduction), lists in by_config.items():
                ops.delayed_scaling_update(*lists, margin=margin, amax_reduction=reduction)
        self._scales = {st: scale.clone() for st, scale in scales.items()}


class PendingAmaxSync:
    """An AmaxSync.start() in flight."""

    def __init__(self, owner: AmaxSync, work, entries: list, buffer) -> None:
        self._owner, self._work, self._entries, self._buffer = owner, work, entries, buffer

    def wait(self) -> None:
        """Waits for the all-reduce and writes the reduced histories and the
        scales computed from them into the layers' state."""
        if self._work is None:
            return
        work, self._work = self._work, None
        work.wait()
        self._owner._write_back(self._entries, self._buffer)
