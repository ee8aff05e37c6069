"""fp8kit's quantizer objects (implemented in C++, fp8kit._torch_ext).

    q = Float8CurrentScalingQuantizer("e4m3", rowwise=True, columnwise=True)
    f8 = q(x)              # a Float8Tensor, made in one C++ call

    scale = torch.ones(1, device=x.device)
    amax = torch.zeros(1, device=x.device)
    q = Float8Quantizer(scale, "e4m3", amax=amax)   # delayed scaling
    f8 = q(x)              # quantized with `scale`, max|x| written to `amax`

    q = Float8BlockQuantizer("e4m3", "block_1x128")  # a scale per 1x128 tile
    b8 = q(x)              # a Float8BlockTensor, made in one C++ call

All accept rowwise / columnwise (which FP8 layouts to produce), support
update_quantized(src, dst) (re-quantize into an existing tensor of theirs),
copy(), to(device), pickling and deepcopy. Float8Quantizer and
Float8CurrentScalingQuantizer derive from Quantizer (per-tensor scaling);
Float8BlockQuantizer, whose tensors have no per-tensor scale, does not.
"""

from __future__ import annotations

from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling
from fp8kit.torch._ext import ext

Quantizer = ext.Quantizer
Float8Quantizer = ext.Float8Quantizer
Float8CurrentScalingQuantizer = ext.Float8CurrentScalingQuantizer
Float8BlockQuantizer = ext.Float8BlockQuantizer


def quantizer_for(recipe, *, backward: bool = False, rowwise: bool = True,
                  columnwise: bool = True, scale=None, amax=None, weight: bool = False):
    """The quantizer a recipe uses for a forward tensor (or a gradient with
    backward=True). Delayed scaling needs the float32[1] `scale` tensor (and
    optionally `amax`) it reads and writes. Block scaling quantizes a weight
    (weight=True) per 128x128 block, anything else per 1x128 tile."""
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
    if isinstance(recipe, BlockScaling):
        if backward and weight:
            raise ValueError("quantizer_for: backward=True and weight=True; a weight is a "
                             "forward tensor (its gradient leaves the layer unquantized)")
        mode = "block_128x128" if weight else "block_1x128"
        return Float8BlockQuantizer(fp8, mode, rowwise, columnwise, float(recipe.amax_epsilon),
                                    recipe.power_2_scale)
    raise TypeError(f"quantizer_for: recipe must be fp8kit.recipe.DelayedScaling, "
                    f"CurrentScaling or BlockScaling, got {type(recipe).__name__}")
