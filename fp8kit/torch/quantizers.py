"""fp8kit's quantizer objects (implemented in C++, fp8kit._torch_ext).

    q = Float8CurrentScalingQuantizer("e4m3", rowwise=True, columnwise=True)
    f8 = q(x)              # a Float8Tensor, made in one C++ call

    scale = torch.ones(1, device=x.device)
    amax = torch.zeros(1, device=x.device)
    q = Float8Quantizer(scale, "e4m3", amax=amax)   # delayed scaling
    f8 = q(x)              # quantized with `scale`, max|x| written to `amax`

Both accept rowwise / columnwise (which FP8 layouts to produce), support
update_quantized(src, dst) (re-quantize into an existing Float8Tensor),
copy(), to(device), pickling and deepcopy.
"""

from __future__ import annotations

from fp8kit.recipe import CurrentScaling, DelayedScaling
from fp8kit.torch._ext import ext

Quantizer = ext.Quantizer
Float8Quantizer = ext.Float8Quantizer
Float8CurrentScalingQuantizer = ext.Float8CurrentScalingQuantizer


def quantizer_for(recipe, *, backward: bool = False, rowwise: bool = True,
                  columnwise: bool = True, scale=None, amax=None):
    """The quantizer a recipe uses for a forward tensor (or a gradient with
    backward=True). Delayed scaling needs the float32[1] `scale` tensor (and
    optionally `amax`) it reads and writes."""
    fmt = recipe.fp8_format
    fp8 = fmt.backward_dtype if backward else fmt.forward_dtype
    if isinstance(recipe, CurrentScaling):
        return Float8CurrentScalingQuantizer(fp8, rowwise, columnwise, recipe.amax_epsilon,
                                             recipe.power_2_scale)
    if isinstance(recipe, DelayedScaling):
        if scale is None:
            raise ValueError("quantizer_for: a DelayedScaling quantizer needs its scale tensor "
                             "(float32 [1]); pass scale=")
        return Float8Quantizer(scale, fp8, amax, rowwise, columnwise)
    raise TypeError(f"quantizer_for: recipe must be fp8kit.recipe.DelayedScaling or "
                    f"CurrentScaling, got {type(recipe).__name__}")
