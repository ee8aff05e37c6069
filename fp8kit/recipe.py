"""Scaling recipes shared by the JAX and PyTorch front ends.

Frozen dataclasses: a recipe is a value, hashable, safe to close over in
`jax.jit` and to store on a module. The scale convention they configure is
written once, in common/include/fp8kit/tensor.h:

    q = saturate(round_to_nearest_even(x * scale)),  x ~= q * scale_inv,
    scale_inv = 1 / scale.

Both recipes' forward_fast_accumulation picks the forward GEMM's
accumulation: the tensor cores' fast (native-precision) accumulation, or
FP32-promoted ("split") accumulation, which the gradient GEMMs always use.
Fast is TransformerEngine's and torchao's default for the forward GEMM;
fp8kit keeps it off by default because it doubled the forward output's
error against bf16 without a measurable end-to-end gain (docs/benchmarks.md
has the measurement).
"""

from __future__ import annotations

import dataclasses
import enum


class Format(enum.Enum):
    """Which FP8 format each kind of tensor uses.

    E4M3: every tensor in float8_e4m3fn (max 448).
    HYBRID: forward tensors (activations, weights) in E4M3, gradients in
    float8_e5m2 (max 57344), which trades mantissa for range.
    """

    E4M3 = "e4m3"
    HYBRID = "hybrid"

    @property
    def forward_dtype(self) -> str:
        return "e4m3"

    @property
    def backward_dtype(self) -> str:
        return "e4m3" if self is Format.E4M3 else "e5m2"


class AmaxReduction(enum.Enum):
    """How delayed scaling turns the amax history into one amax."""

    MAX = "max"
    MOST_RECENT = "most_recent"


def _check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")


@dataclasses.dataclass(frozen=True)
class DelayedScaling:
    """Scale from the history of past amaxes (one step late, no extra pass).

    scale = fp8_max / amax_reduced / 2**margin, with amax_reduced the max (or
    the most recent) of the last `amax_history_len` amaxes; a zero or
    non-finite amax keeps the previous scale.
    """

    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 16
    margin: int = 0
    amax_reduction: AmaxReduction = AmaxReduction.MAX
    forward_fast_accumulation: bool = False   # see the module docstring

    def __post_init__(self):
        _check_bool("forward_fast_accumulation", self.forward_fast_accumulation)
        if not isinstance(self.fp8_format, Format):
            raise TypeError(f"fp8_format must be an fp8kit.recipe.Format, got {self.fp8_format!r}")
        if not isinstance(self.amax_reduction, AmaxReduction):
            raise TypeError(
                "amax_reduction must be an fp8kit.recipe.AmaxReduction, "
                f"got {self.amax_reduction!r}")
        if not isinstance(self.amax_history_len, int) or self.amax_history_len < 1:
            raise ValueError(f"amax_history_len must be an int >= 1, got {self.amax_history_len!r}")
        if not isinstance(self.margin, int) or self.margin < 0:
            raise ValueError(f"margin must be an int >= 0, got {self.margin!r}")


@dataclasses.dataclass(frozen=True)
class CurrentScaling:
    """Scale from this tensor's own amax (an extra reduction pass, no state).

    scale = fp8_max / max(amax, amax_epsilon), optionally rounded down to a
    power of two; a zero or non-finite amax gives scale 1.
    """

    fp8_format: Format = Format.HYBRID
    amax_epsilon: float = 0.0
    power_2_scale: bool = False
    forward_fast_accumulation: bool = False   # see the module docstring

    def __post_init__(self):
        _check_bool("forward_fast_accumulation", self.forward_fast_accumulation)
        if not isinstance(self.fp8_format, Format):
            raise TypeError(f"fp8_format must be an fp8kit.recipe.Format, got {self.fp8_format!r}")
        if not (self.amax_epsilon >= 0.0):
            raise ValueError(f"amax_epsilon must be >= 0, got {self.amax_epsilon!r}")


Recipe = DelayedScaling | CurrentScaling
