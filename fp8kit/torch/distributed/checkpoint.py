"""FP8LoadPlanner: torch.distributed.checkpoint (DCP) loads of fp8kit
layers' scaling state, complete and unpickling nothing but plain data.

    state = {"model": get_model_state_dict(model)}
    dcp.load(state, checkpoint_id=path, planner=FP8LoadPlanner())
    set_model_state_dict(model, state["model"])

DCP saves a layer's extra state (Linear.get_extra_state(): plain values
and tensors in nested dicts and lists) flattened: one tensor entry per
amax_history, scale and seeded, one bytes entry per plain value. It loads
into the structure of the state dict it is given, and a model that has not
run yet has no scaling states: its extra state has an empty list where the
checkpoint holds one entry per recipe, and the recorded state would be
missing. FP8LoadPlanner first rebuilds every `_extra_state` entry of the
state dict from the checkpoint's own entries under that key (CPU tensors
of the saved shapes; plain values to be read), so the whole saved state
loads whatever the model has run, on any number of ranks. It then reads
every bytes entry with torch.load(weights_only=True): a checkpoint whose
values are anything but plain data fails to load, naming the entry,
instead of running its pickled code.

Checkpoint keys of the fp8kit extra states are dict keys that are never
all digits, so an all-digit key part is a list index.
"""

from __future__ import annotations

import io

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

_EXTRA_STATE = "_extra_state"


class FP8LoadPlanner(DefaultLoadPlanner):
    """A DefaultLoadPlanner that loads module extra states in the
    checkpoint's structure and plain values with weights_only=True."""

    def set_up_planner(self, state_dict, metadata=None, is_coordinator: bool = False) -> None:
        if metadata is not None:
            _reshape_extra_states(state_dict, (), metadata.state_dict_metadata)
        super().set_up_planner(state_dict, metadata, is_coordinator)

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        try:
            torch.load(value, weights_only=True)
        except Exception as e:
            raise RuntimeError(
                f"fp8kit.torch.distributed.FP8LoadPlanner: checkpoint entry "
                f"{read_item.dest_index.fqn!r} is not plain data (tensors, numbers, strings, "
                f"lists, dicts), so it is not loaded: {e}") from e
        value.seek(0)  # plain data, checked: DefaultLoadPlanner places it
        super().load_bytes(read_item, value)


def _reshape_extra_states(node: dict, path: tuple, saved: dict) -> None:
    """Replaces each `_extra_state` value under `node` (a nested dict at
    `path`) that the checkpoint holds entries for by their structure."""
    for key, value in list(node.items()):
        here = path + (str(key),)
        if isinstance(value, dict) and not str(key).endswith(_EXTRA_STATE):
            _reshape_extra_states(value, here, saved)
        elif str(key).endswith(_EXTRA_STATE) and isinstance(value, dict):
            prefix = ".".join(here) + "."
            entries = {fqn[len(prefix):]: md for fqn, md in saved.items()
                       if fqn.startswith(prefix)}
            if entries:
                node[key] = _skeleton(entries)


def _skeleton(entries: dict):
    """Nested dicts and lists with a CPU tensor of the saved shape and dtype
    for each tensor entry and None for each plain value (filled in by the
    load), from {relative key: storage metadata}."""
    root = {}
    for rel, md in entries.items():
        parts = rel.split(".")
        leaf = (torch.empty(md.size, dtype=md.properties.dtype)
                if isinstance(md, TensorStorageMetadata) else None)
        node = root
        for part, nxt in zip(parts[:-1], parts[1:]):
            node = _child(node, part, [] if nxt.isdigit() else {})
        _set(node, parts[-1], leaf)
    return root


def _child(node, part: str, empty):
    if isinstance(node, list):
        index = int(part)
        node.extend([None] * (index + 1 - len(node)))
        if node[index] is None:
            node[index] = empty
        return node[index]
    return node.setdefault(part, empty)


def _set(node, part: str, leaf) -> None:
    if isinstance(node, list):
        index = int(part)
        node.extend([None] * (index + 1 - len(node)))
        node[index] = leaf
    else:
        node[part] = leaf
