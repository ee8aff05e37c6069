"""CastStatistics: what a cast to FP8 did to a tensor, the result of
fp8kit.torch.cast_statistics and fp8kit.jax.cast_statistics alike.

For each element x of the high-precision input, q is its code in the FP8
copy read and d = q * scale_inv its dequantized value (one float32
multiply, by the tensor's scale_inv or its block's), as the core defines
them (common/include/fp8kit/statistics.h):

    amax       max |x|; NaN if x holds a NaN, else inf if it holds an inf
    underflow  finite x != 0 that the cast flushed to +-0
    saturated  finite x cast to +-fp8_max: clipped, or landing on it exactly
               (under current or block scaling with exact scales every
               tensor's or block's amax does, by construction; a power-of-2
               scale maps it below)
    error_sq   sum over finite x of (d - x)^2
    norm_sq    sum over finite x of x^2

Non-finite x are left out of the counts and the sums. The fields are the
framework's 0-d arrays (amax and the sums float32, the counts integers) on
the input's device; the derived values use arithmetic operators only, so
they stay there too (no host synchronisation) and trace under
torch.compile and jax.jit. Framework-free, like fp8kit.recipe.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class CastStatistics(NamedTuple):
    """The statistics of one FP8 cast (see the module docstring)."""

    amax: Any
    underflow: Any
    saturated: Any
    error_sq: Any
    norm_sq: Any

    @property
    def relative_error(self):
        """sqrt(error_sq / norm_sq), the error relative to the signal; NaN
        when norm_sq is 0 (no signal to compare with). SQNR in dB is
        -20 * log10 of it."""
        return (self.error_sq / self.norm_sq) ** 0.5

    def underflow_rate(self, numel):
        """underflow / numel: the fraction of the input flushed to zero."""
        return self.underflow / numel

    def saturation_rate(self, numel):
        """saturated / numel: the fraction of the input at +-fp8_max."""
        return self.saturated / numel
