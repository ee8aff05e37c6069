"""Scaling recipes shared by the JAX and PyTorch front ends.

Frozen dataclasses: a recipe is a value, hashable, safe to close over in
`jax.jit` and to store on a module. The scale convention they configure is
written once, in common/include/fp8kit/tensor.h:

    q = saturate(round_to_nearest_even(x * scale)),  x ~= q * scale_inv,
    scale_inv = 1 / scale.

saturate applies to finite values only: +-inf becomes NaN in E4M3 (which
has no inf) and stays +-inf in E5M2, and NaN stays NaN, so an inf or NaN
that reaches an FP8 layer makes every output it touches non-finite, as in
bf16. A non-finite amax never becomes a scale: delayed scaling keeps the
previous scales, current scaling and each block of block scaling use
scale 1 for that step, so finite values beside the inf stay finite.

The per-tensor recipes' forward_fast_accumulation picks the forward GEMM's
accumulation: the tensor cores' fast (native-precision) accumulation, or
FP32-promoted ("split") accumulation, which the gradient GEMMs always use
(as BlockScaling's GEMMs all do: cuBLASLt's block-scaled GEMM has no fast
mode).
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


# The valid ranges of a recipe. The core defines the same numbers
# (FP8KIT_MARGIN_MAX and FP8KIT_AMAX_HISTORY_LEN_MAX in
# common/include/fp8kit/delayed_scaling.h) and checks them again; both
# extensions export them (MARGIN_MAX, AMAX_HISTORY_LEN_MAX), and
# tests/test_recipe.py checks that all agree. Kept here as plain numbers so
# that this module imports no extension.
MARGIN_MAX = 126                 # 2**-margin stays a normal float32
AMAX_HISTORY_LEN_MAX = 1 << 20   # far beyond any useful history
# amax_epsilon is a float32 in the core (fp8kit_current_scaling_config):
# finite there means at most the largest float32.
AMAX_EPSILON_MAX = 3.4028234663852886e38
# BlockScaling's block side: 1 x BLOCK_LEN tiles, BLOCK_LEN x BLOCK_LEN blocks
# (FP8KIT_BLOCK_LEN in common/include/fp8kit/block_scaling.h).
BLOCK_LEN = 128


def _bad(recipe, field: str, value, requirement: str) -> str:
    """'DelayedScaling.margin must be an int in [0, 126], got 1.5 (float)'."""
    return (f"{type(recipe).__name__}.{field} must be {requirement}, got {value!r} "
            f"({type(value).__name__})")


def _check_enum(recipe, field: str, value, enum_cls) -> None:
    if not isinstance(value, enum_cls):
        members = ", ".join(f"{enum_cls.__name__}.{m.name}" for m in enum_cls)
        raise TypeError(_bad(recipe, field, value,
                             f"an fp8kit.recipe.{enum_cls.__name__} ({members})"))


def _check_bool(recipe, field: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(_bad(recipe, field, value, "a bool (True or False)"))


def _check_int(recipe, field: str, value, lo: int, hi: int) -> None:
    # bool is an int subclass, but True as a length or margin is a mistake.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(_bad(recipe, field, value, f"an int in [{lo}, {hi}]"))
    if not lo <= value <= hi:
        raise ValueError(_bad(recipe, field, value, f"an int in [{lo}, {hi}]"))


def _check_epsilon(recipe, field: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(_bad(recipe, field, value, "a float (or int) >= 0; 0.0 disables it"))
    if not 0 <= value <= AMAX_EPSILON_MAX:  # NaN and inf fail too
        raise ValueError(_bad(recipe, field, value,
                              f"a finite float >= 0 (at most {AMAX_EPSILON_MAX:g}, the largest "
                              "float32); 0.0 disables it"))


@dataclasses.dataclass(frozen=True)
class DelayedScaling:
    """Scale from the history of past amaxes (one step late, no extra pass).

    scale = fp8_max / amax_reduced / 2**margin, with amax_reduced the max (or
    the most recent) of the last `amax_history_len` amaxes; a zero or
    non-finite amax keeps the previous scale. Next to FLT_MAX the scale
    stops at fp8_max / FLT_MAX, so that no FP8 value dequantizes to inf.

    Every field is checked here, at construction (TypeError for a wrong
    type, ValueError for a value out of range): amax_history_len an int in
    [1, AMAX_HISTORY_LEN_MAX], margin an int in [0, MARGIN_MAX] (a bool is
    neither), the enums their classes, forward_fast_accumulation a bool.
    """

    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 16
    margin: int = 0
    amax_reduction: AmaxReduction = AmaxReduction.MAX
    forward_fast_accumulation: bool = False   # see the module docstring

    def __post_init__(self):
        _check_enum(self, "fp8_format", self.fp8_format, Format)
        _check_int(self, "amax_history_len", self.amax_history_len, 1, AMAX_HISTORY_LEN_MAX)
        _check_int(self, "margin", self.margin, 0, MARGIN_MAX)
        _check_enum(self, "amax_reduction", self.amax_reduction, AmaxReduction)
        _check_bool(self, "forward_fast_accumulation", self.forward_fast_accumulation)


@dataclasses.dataclass(frozen=True)
class CurrentScaling:
    """Scale from this tensor's own amax (an extra reduction pass, no state).

    scale = fp8_max / max(amax, amax_epsilon), optionally rounded down to a
    power of two; a zero or non-finite amax gives scale 1.

    Every field is checked here, at construction: amax_epsilon an int or
    float (not a bool or str), finite and >= 0 (at most AMAX_EPSILON_MAX,
    as the core holds it in a float32); power_2_scale and
    forward_fast_accumulation bools.
    """

    fp8_format: Format = Format.HYBRID
    amax_epsilon: float = 0.0
    power_2_scale: bool = False
    forward_fast_accumulation: bool = False   # see the module docstring

    def __post_init__(self):
        _check_enum(self, "fp8_format", self.fp8_format, Format)
        _check_epsilon(self, "amax_epsilon", self.amax_epsilon)
        _check_bool(self, "power_2_scale", self.power_2_scale)
        _check_bool(self, "forward_fast_accumulation", self.forward_fast_accumulation)


@dataclasses.dataclass(frozen=True)
class BlockScaling:
    """A scale per block, from that block's own amax (no state, no history).

    Activations and gradients get one scale per 1 x BLOCK_LEN tile (along
    the dimension each GEMM contracts, so the transposed copy has tiles and
    scales of its own), weights one per BLOCK_LEN x BLOCK_LEN block; an
    outlier costs precision only in its own block. Per block, as current
    scaling per tensor: scale = fp8_max / max(amax, amax_epsilon), rounded
    down to a power of two when power_2_scale; a block of zeros or one
    holding a NaN or inf gets scale 1 (common/include/fp8kit/block_scaling.h
    states the rule exactly). The GEMMs run on cuBLASLt's block-scaled
    Hopper kernels, always with split accumulation.

    E4M3 for every tensor by default: with a scale per block, gradients need
    E5M2's range less than they need E4M3's extra mantissa bit.
    power_2_scale defaults to True, which makes every scale_inv exact (as
    TransformerEngine's Float8BlockScaling does).

    Every field is checked here, at construction, as in CurrentScaling.
    """

    fp8_format: Format = Format.E4M3
    amax_epsilon: float = 0.0
    power_2_scale: bool = True

    def __post_init__(self):
        _check_enum(self, "fp8_format", self.fp8_format, Format)
        _check_epsilon(self, "amax_epsilon", self.amax_epsilon)
        _check_bool(self, "power_2_scale", self.power_2_scale)

    @property
    def forward_fast_accumulation(self) -> bool:
        """False: cuBLASLt's block-scaled GEMM has no fast-accumulation mode
        (read like the per-tensor recipes' field; not settable)."""
        return False


# Every recipe a layer takes (fp8kit.torch.autocast, fp8kit.jax.dense).
Recipe = DelayedScaling | CurrentScaling | BlockScaling
