"""Delayed scaling for fp8kit.jax.grouped_dense: one DelayedScalingState per
expert, stacked along a leading expert axis (GroupedDelayedScalingState),
and the grouped cast that seeds, casts and records each expert's row of it.

Each expert scales and records as one fp8kit.jax.dense of its own
(fp8kit/jax/delayed_scaling.py gives the protocol; the grouped core op,
fp8kit_grouped_quantize_delayed_update, applies it to every expert in one
pass), with the rule of fp8kit.torch.GroupedLinear for an expert that has
no tokens in a step: its input records amax 0 (keeping its scale) and its
output gradient is not cast, so that slot keeps its state, as a Linear
given no tokens skips its backward cast.

The new state leaves grouped_dense as the cotangent of its `state`
argument, exactly as dense's does: differentiate the loss with respect to
the state too and take that "gradient" as the next state; use each state
in one call per step.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from fp8kit import recipe as recipe_lib
from fp8kit.jax import _checks, _ffi, _ffi_grouped, _state_values
from fp8kit.jax import _sharding_grouped as shg
from fp8kit.jax.delayed_scaling import NUM_SLOTS, DelayedScalingState


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GroupedDelayedScalingState:
    """amax_history: float32 [E, 3, amax_history_len]; scale, seeded:
    float32 [E, 3]. Row e is expert e's DelayedScalingState (expert(e)),
    its slots INPUT, WEIGHT, GRAD_OUTPUT as in fp8kit/jax/delayed_scaling.py.

    The constructor checks nothing (JAX rebuilds the state from tracers);
    make one with create(recipe, num_experts) or from_arrays (checked)."""

    amax_history: jax.Array
    scale: jax.Array
    seeded: jax.Array

    @classmethod
    def create(cls, recipe: recipe_lib.DelayedScaling,
               num_experts: int) -> "GroupedDelayedScalingState":
        """Fresh state for num_experts experts: empty histories, scale 1,
        every slot unseeded."""
        fn = "GroupedDelayedScalingState.create"
        if not isinstance(recipe, recipe_lib.DelayedScaling):
            raise TypeError(f"{fn}: recipe must be an fp8kit.recipe.DelayedScaling, got "
                            f"{type(recipe).__name__}")
        e = _checks.int_in(fn, "num_experts", num_experts, 1, _ffi_grouped.MAX_GROUPS)
        return cls(amax_history=jnp.zeros((e, NUM_SLOTS, recipe.amax_history_len), jnp.float32),
                   scale=jnp.ones((e, NUM_SLOTS), jnp.float32),
                   seeded=jnp.zeros((e, NUM_SLOTS), jnp.float32))

    @classmethod
    def from_arrays(cls, amax_history, scale, seeded) -> "GroupedDelayedScalingState":
        """A state from its three arrays (kept as given), checked: float32
        of shapes [E, 3, len], [E, 3], [E, 3], and the values where they
        are concrete (the rules of DelayedScalingState)."""
        return cls._checked("GroupedDelayedScalingState.from_arrays",
                            "pass the arrays of a state fp8kit made (create, or a layer's update)",
                            amax_history=amax_history, scale=scale, seeded=seeded)

    @property
    def num_experts(self) -> int:
        return self.scale.shape[0]

    def expert(self, e: int) -> DelayedScalingState:
        """Expert e's state: what fp8kit.jax.dense would hold for it."""
        return DelayedScalingState(self.amax_history[e], self.scale[e], self.seeded[e])

    def to_state_dict(self) -> dict:
        """{"amax_history", "scale", "seeded": array} (Flax serialization)."""
        return {name: getattr(self, name) for name in _state_values.FIELDS}

    def from_state_dict(self, state_dict: dict) -> "GroupedDelayedScalingState":
        """The state `state_dict` holds, for this state's place: the same
        shapes, checked as from_arrays checks."""
        fn = "GroupedDelayedScalingState.from_state_dict"
        _state_values.check_saved_state(fn, self, state_dict, "experts, amax_history_len")
        return type(self)._checked(fn, "the checkpoint is corrupt (restore an earlier one)",
                                   **state_dict)

    @classmethod
    def _checked(cls, fn: str, fix: str, **arrays) -> "GroupedDelayedScalingState":
        _state_values.check_float32_arrays(fn, arrays)
        h, s, d = (tuple(arrays[n].shape) for n in _state_values.FIELDS)
        if (len(h) != 3 or h[1] != NUM_SLOTS or s != h[:2] or d != h[:2]
                or not 1 <= h[0] <= _ffi_grouped.MAX_GROUPS
                or not 1 <= h[2] <= _ffi.AMAX_HISTORY_LEN_MAX):
            raise ValueError(
                f"{fn}: amax_history, scale and seeded have shapes {(h, s, d)}; a state has "
                f"[E, {NUM_SLOTS}, amax_history_len], [E, {NUM_SLOTS}] and [E, {NUM_SLOTS}] with "
                f"1 <= amax_history_len <= {_ffi.AMAX_HISTORY_LEN_MAX}")
        state = cls(**arrays)
        state.check_values(f"{fn}: ", fix)
        return state

    def check_values(self, where: str, fix: str) -> None:
        """As DelayedScalingState.check_values: the first value that breaks
        its field's rule is a ValueError; nothing for a traced state."""
        if _state_values.is_concrete(self):
            bad = _state_values.first_bad_value(self, fix)
            if bad is not None:
                raise ValueError(f"{where}{bad}")


def check_state(fn: str, recipe: recipe_lib.DelayedScaling, state, num_experts: int) -> None:
    """state must be a GroupedDelayedScalingState of num_experts experts and
    the recipe's history length, float32, its concrete values valid."""
    create = f"GroupedDelayedScalingState.create(recipe, num_experts={num_experts})"
    if not isinstance(state, GroupedDelayedScalingState):
        raise TypeError(f"{fn}: a DelayedScaling recipe needs state={create}, got "
                        f"{type(state).__name__}")
    want = {"amax_history": (num_experts, NUM_SLOTS, recipe.amax_history_len),
            "scale": (num_experts, NUM_SLOTS), "seeded": (num_experts, NUM_SLOTS)}
    for name, shape in want.items():
        a = getattr(state, name)
        if not hasattr(a, "dtype") or jnp.dtype(a.dtype) != jnp.float32:
            raise TypeError(f"{fn}: state.{name} must be a float32 array of shape {shape}; "
                            f"create the state with {create}")
        if tuple(a.shape) != shape:
            raise ValueError(f"{fn}: state.{name} has shape {tuple(a.shape)}; the kernels and "
                             f"the recipe need {shape}. Create it with {create}.")
    state.check_values(f"{fn}: state.", f"start from a fresh {create} (the layers' updates "
                                        "never write such a value)")


def _group_scales(v):
    """[E] -> the core's per-group layout [E, GROUP_SCALE_STRIDE], column 0."""
    return jnp.pad(v[:, None], ((0, 0), (0, _ffi_grouped.GROUP_SCALE_STRIDE - 1)))


def quantize_and_record(state: GroupedDelayedScalingState, recipe: recipe_lib.DelayedScaling,
                        slot: int, t, sizes, fmt: str, copies, record: bool, used=None):
    """The delayed-scaling grouped cast of t [T, F] (groups of `sizes`, a
    sizes_operand) with slot `slot` of each expert's state: seeded, and
    recorded when `record`, except for the experts where `used` (bool [E],
    or None for all) is False, whose slot keeps its state. Returns (state,
    data, grouped columnwise copy, scale_inv)."""
    rowwise, columnwise = copies
    history = state.amax_history[:, slot]
    data, cw, _, scale_inv, _, new_history, new_scale, new_seeded = shg.grouped_quantize_delayed(
        t, sizes, fmt, rowwise, columnwise, history, _group_scales(state.scale[:, slot]),
        _group_scales(state.seeded[:, slot]), recipe.margin, recipe.amax_reduction.value, record)
    if record:
        new_scale, new_seeded = new_scale[:, 0], new_seeded[:, 0]
        if used is not None:
            new_history = jnp.where(used[:, None], new_history, history)
            new_scale = jnp.where(used, new_scale, state.scale[:, slot])
            new_seeded = jnp.where(used, new_seeded, state.seeded[:, slot])
        state = GroupedDelayedScalingState(
            amax_history=state.amax_history.at[:, slot].set(new_history),
            scale=state.scale.at[:, slot].set(new_scale),
            seeded=state.seeded.at[:, slot].set(new_seeded))
    return state, data, cw, scale_inv
