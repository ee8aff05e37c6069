"""What a layer whose FP8 scaling state lives in C++ objects (RecipeStates)
needs from torch.nn.Module, written once for Linear and the fused layers:
the state travels as the module's extra state, in checkpoints and when the
module is pickled (torch.save(module), copy.deepcopy), and a checkpoint
without it (a plain torch.nn module's) loads with a fresh state. Loading
one checks its entries (check_entries here; each recipe's state in
RecipeStates.from_checkpoint and LinearState.from_state)."""

from __future__ import annotations

_FRESH = "drop its '_extra_state' entries to load the weights with a fresh FP8 state"


def check_entries(saved: dict, keys: tuple, where: str) -> None:
    """ValueError naming the first of `keys` that the saved dict `saved`
    (named `where`) lacks, or an entry it has beyond them: a missing
    entry would silently start that part of the state fresh, and an
    unknown one would be dropped."""
    expected = ", ".join(repr(k) for k in keys)
    for key in keys:
        if key not in saved:
            raise ValueError(f"{where} has no {key!r} entry (it must have {expected}): the "
                             f"checkpoint is incomplete; {_FRESH}")
    for key in saved:
        if key not in keys:
            raise ValueError(f"{where} has an unknown entry {key!r} (it must have only "
                             f"{expected}): it was written by another fp8kit version or "
                             f"another layer type; {_FRESH}")


class FP8ExtraState:
    """Mixin placed before the torch.nn.Module base. Subclasses define
    get_extra_state, set_extra_state (whose errors may name the checkpoint
    key in self._fp8_loading while a state_dict loads) and
    _fresh_fp8_states()."""

    def _fresh_fp8_states(self):
        raise NotImplementedError

    def _states_by_gemm(self) -> dict:
        """{GEMM name: its RecipeStates}."""
        raise NotImplementedError

    def _fp8_device(self):
        raise NotImplementedError

    def fp8_state_arrays(self, recipe) -> dict:
        """{GEMM name: `recipe`'s scaling state as fp8kit.checkpoint's
        arrays (amax_history [3, amax_history_len], scale [3], seeded [3],
        float32 NumPy; the rows input, weight, grad_output) or None before
        the recipe's first use}: the arrays fp8kit.jax's DelayedScalingState
        holds for the same layer."""
        return {g: st.arrays(recipe) for g, st in self._states_by_gemm().items()}

    def load_fp8_state_arrays(self, recipe, arrays: dict) -> None:
        """Sets `recipe`'s scaling state from fp8_state_arrays()'s dict
        (every GEMM of the layer), checked as a saved state is."""
        gemms = self._states_by_gemm()
        check_entries(arrays, tuple(gemms), f"{type(self).__name__}.load_fp8_state_arrays")
        for g, st in gemms.items():
            # Only a Linear may cache its FP8 weight (cache_fp8_weight).
            st.set_arrays(recipe, arrays[g], self._fp8_device(),
                          getattr(self, "_fp8_cache_weight", False),
                          f"{type(self).__name__}.load_fp8_state_arrays: [{g!r}]")

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        # set_extra_state's errors name the checkpoint key they come from.
        self._fp8_loading = repr(prefix + "_extra_state")
        try:
            super()._load_from_state_dict(state_dict, prefix, local_metadata, strict,
                                          missing_keys, unexpected_keys, error_msgs)
        finally:
            del self._fp8_loading
        key = prefix + "_extra_state"  # a checkpoint without FP8 state starts fresh
        if key in missing_keys:
            missing_keys.remove(key)

    def __getstate__(self):
        d = self.__dict__.copy()
        d["_fp8_saved"] = self.get_extra_state()
        d["_fp8_states"] = None
        return d

    def __setstate__(self, d):
        saved = d.pop("_fp8_saved", None)
        super().__setstate__(d)
        self._fp8_states = self._fresh_fp8_states()
        if saved is not None:
            self.set_extra_state(saved)
