"""The layer protocol (common/include/fp8kit/linear.h) in NumPy, for the
Linear / dense properties: per-slot scaling state, the three GEMMs of a
training step in float64 on the dequantized FP8 operands, and their error
bounds. Independent of fp8kit, torch and jax.

Slots: x and the weight in the recipe's forward format, dy in its
backward format. Current scaling: each tensor's own scale. Delayed
scaling: a fresh slot's first quantization is seeded from the tensor's own
amax; a differentiated step records the amax (roll the history, reduce,
new scale); a step that computes no gradient records nothing.
"""

from __future__ import annotations

import dataclasses

import numpy as np

import fp8_reference as ref


@dataclasses.dataclass
class Recipe:
    """The scaling parameters of fp8kit.recipe.DelayedScaling / CurrentScaling."""

    delayed: bool
    hybrid: bool
    margin: int = 0
    amax_history_len: int = 1
    reduction: str = "max"
    epsilon: float = 0.0
    pow2: bool = False

    def fmt(self, slot: str) -> str:
        return "e5m2" if slot == "dy" and self.hybrid else "e4m3"


@dataclasses.dataclass
class Slot:
    history: np.ndarray
    scale: np.float32 = np.float32(1.0)
    seeded: bool = False


def fresh_state(recipe: Recipe) -> dict:
    return {name: Slot(np.zeros(recipe.amax_history_len, np.float32)) for name in ("x", "w", "dy")}


def quantize_slot(recipe: Recipe, state: dict, slot: str, values: np.ndarray, record: bool):
    """(float64 dequantized operand, scale used) of one cast; updates `state`."""
    fmt = recipe.fmt(slot)
    amax = ref.amax(values)
    s = state[slot]
    if not recipe.delayed:
        scale = ref.current_scale(amax, fmt, recipe.epsilon, recipe.pow2)
    elif s.seeded:
        scale = s.scale
    else:
        scale = ref.delayed_scale(amax, s.scale, fmt, recipe.margin)
    q = ref.quantize_dequantize(values, scale, fmt)
    if recipe.delayed and record:
        h, new_scale, _ = ref.delayed_update(s.history[None], [amax], [scale], [fmt],
                                             recipe.margin, recipe.reduction)
        s.history, s.scale, s.seeded = h[0], new_scale[0], True
    return q, scale


def _gemm(a, b, out: str, device: str, bias=None):
    """(want, bound) of a @ b (+ bias) accumulated on `device`, rounded to `out`."""
    with np.errstate(invalid="ignore", over="ignore"):
        want = a @ b
        bound = ref.accumulation_bound(a, b, device)
        if bias is not None:
            # Added in float32 to the float32 sum (once more for a float32 output).
            want = want + bias
            bound = bound + (np.abs(want) + np.abs(bias)) * 2.0 ** -23
        return want, bound + ref.rounding_bound(want, out)


def forward(recipe: Recipe, state: dict, x2d, weight, bias, out: str, record: bool,
            device: str):
    """y = Q(x) @ Q(weight)^T (+ bias); weight is [N, K]. Returns
    (y, bound, saved) with saved = the quantized x and weight."""
    xq, _ = quantize_slot(recipe, state, "x", x2d, record)
    wq, _ = quantize_slot(recipe, state, "w", weight, record)
    y, bound = _gemm(xq, wq.T, out, device, None if bias is None else bias.astype(np.float64))
    return y, bound, (xq, wq)


def backward(recipe: Recipe, state: dict, saved, dy2d, x_out: str, w_out: str, device: str):
    """dx = Q(dy) @ Q(w), dw = Q(dy)^T @ Q(x), db = column sums of dy;
    each (want, bound)."""
    xq, wq = saved
    dq, _ = quantize_slot(recipe, state, "dy", dy2d, True)
    dx = _gemm(dq, wq, x_out, device)
    dw = _gemm(dq.T, xq, w_out, device)
    d64 = np.asarray(dy2d, np.float64)
    db = d64.sum(axis=0)
    db_bound = (d64.shape[0] + 2) * 2.0 ** -24 * np.abs(d64).sum(axis=0) + \
        ref.rounding_bound(db, w_out)
    return dx, dw, (db, db_bound)
