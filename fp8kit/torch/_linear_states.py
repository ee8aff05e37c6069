"""The FP8 scaling states of one fp8kit.torch.Linear: one ext.LinearState
per scaling recipe, shared by every thread that runs the layer.

A recipe's state is found by its scaling parameters (ext.linear_recipe
checks the recipe and returns them as plain values), so recipes that differ
only in forward_fast_accumulation share one state, and switching recipes
keeps every recipe's recorded history. select() returns the state and the
flag together as locals of the caller: nothing a call uses is re-read from
the layer after another thread may have changed it.
"""

from __future__ import annotations

import itertools
import threading
import weakref

import torch

from fp8kit.recipe import BlockScaling
from fp8kit.torch._ext import ext

_KEYS = itertools.count()
_BY_KEY = weakref.WeakValueDictionary()   # RecipeStates.key -> RecipeStates


def _key(scaling: dict) -> tuple:
    return tuple(sorted(scaling.items()))


class RecipeStates:
    """The states of one layer, keyed by their recipes' scaling parameters."""

    def __init__(self) -> None:
        # Creating a state happens once per recipe, under the lock, so two
        # threads meeting a new recipe at once share one state.
        self._lock = threading.Lock()
        self._states = {}      # scaling key -> ext.LinearState
        self._latest = None    # (recipe, state, fast) of the latest select
        # A string naming this object: compiled code hands the trace-time
        # selection (fp8kit.torch._traced_linear) this constant, which every
        # torch.compile version takes, rather than the object. Not an int:
        # dynamo makes an int that differs between calls of one compiled
        # function (each layer of a model compiled per layer) a symbolic
        # value, which the selection cannot take (a graph break under
        # FSDP2); a string is guarded by equality (one graph per layer).
        self.key = f"fp8kit-linear-states-{next(_KEYS)}"
        _BY_KEY[self.key] = self

    def select(self, recipe, weight, cache_weight: bool):
        """(state, forward_fast_accumulation) for `recipe`, made on weight's
        device on first use."""
        latest = self._latest  # one read: recipe, state and flag belong together
        if latest is not None and latest[0] is recipe:
            return latest[1], latest[2]
        scaling, fast = ext.linear_recipe(recipe)
        key = _key(scaling)
        with self._lock:
            state = self._states.get(key)
            if state is None:
                state = ext.LinearState(recipe, weight.device)
                state.cache_weight = cache_weight
                self._states[key] = state
        self._latest = (recipe, state, fast)
        return state, fast

    def get(self, recipe):
        if isinstance(recipe, BlockScaling):  # keeps no state
            return None
        scaling, _ = ext.linear_recipe(recipe)
        return self._states.get(_key(scaling))

    def all(self) -> tuple:
        with self._lock:
            return tuple(self._states.values())

    def latest(self):
        latest = self._latest
        if latest is not None:
            return latest[1]
        states = self.all()
        return states[-1] if states else None

    def arrays(self, recipe):
        """`recipe`'s state as fp8kit.checkpoint's arrays ({"amax_history",
        "scale", "seeded"}: float32 NumPy, seeded 0.0 / 1.0), the layout
        fp8kit.jax's DelayedScalingState holds; None before its first use."""
        state = self.get(recipe)
        if state is None:
            return None
        saved = state.get_state()
        return {k: saved[k].numpy() for k in ("amax_history", "scale", "seeded")}

    def set_arrays(self, recipe, arrays: dict, device, cache_weight: bool, where: str) -> None:
        """Makes `recipe`'s state the one `arrays` (arrays()'s layout)
        describe, checked as a saved state is (errors name `where`)."""
        scaling, _ = ext.linear_recipe(recipe)
        entry = {"recipe": scaling, **{k: torch.as_tensor(arrays[k])
                                       for k in ("amax_history", "scale", "seeded")}}
        state = ext.LinearState.from_state(entry, device, where)
        state.cache_weight = cache_weight
        with self._lock:
            self._states[_key(scaling)] = state
            self._latest = None

    @classmethod
    def from_checkpoint(cls, entries: list, device, cache_weight: bool, where: str):
        """The states of a list of LinearState.get_state() dicts (one per
        recipe, as a layer's get_extra_state() writes them), each entry
        checked (errors name it after `where`, the list's name)."""
        if not isinstance(entries, list):
            raise TypeError(f"{where} is {entries!r} ({type(entries).__name__}); it must be the "
                            "list of per-recipe FP8 states the layer's get_extra_state() writes "
                            "(drop the entry to start the FP8 state fresh)")
        out = cls()
        for i, entry in enumerate(entries):
            state = ext.LinearState.from_state(entry, device, f"{where}[{i}]")
            state.cache_weight = cache_weight
            key = _key(state.recipe)
            if key in out._states:
                raise ValueError(f"{where}[{i}] has the scaling recipe of an earlier entry "
                                 f"({state.recipe}); a layer keeps one state per recipe")
            out._states[key] = state
        return out


def by_key(key: str) -> RecipeStates:
    """The live RecipeStates whose .key is `key`."""
    return _BY_KEY[key]
