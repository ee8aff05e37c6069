"""A non-finite input stays visible through fp8kit.torch's FP8 layers.

For each recipe (DelayedScaling, CurrentScaling, BlockScaling) and layer
(Linear, LayerNormLinear, LayerNormMLP under autocast), an inf or a NaN in
one row of the input gives a non-finite output in that row, as the same
layer in bf16 does, and a finite one elsewhere: the FP8 cast saturates
finite values only (+-inf becomes NaN in E4M3, which has no inf), and a
non-finite amax keeps a usable scale (common/include/fp8kit/quantize.h).
The norms of the fused layers make a row holding an inf NaN already.
Also: block-scaled values next to FLT_MAX dequantize to finite values
(the scale floor of common/include/fp8kit/block_scaling.h)."""

import pytest
import torch

import fp8kit.torch as ft
from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling

RECIPES = {"delayed": DelayedScaling(), "current": CurrentScaling(), "block": BlockScaling()}
LAYERS = ("Linear", "LayerNormLinear", "LayerNormLinear-RMSNorm", "LayerNormMLP",
          "LayerNormMLP-RMSNorm-swiglu")
VALUES = {"inf": float("inf"), "-inf": float("-inf"), "nan": float("nan")}
TOKENS, HIDDEN, OUT = 32, 128, 64
BAD_ROW = 3
FLT_MAX = torch.finfo(torch.float32).max
MODES = ("block_1x128", "block_128x128")


def make(layer, seed=0):
    """A bf16 layer named as in LAYERS: class[-normalization][-activation]."""
    torch.manual_seed(seed)
    name, *options = layer.split("-")
    kw = {"dtype": torch.bfloat16}
    if options:
        kw["normalization"] = options[0]
    if name == "Linear":
        return ft.Linear(HIDDEN, OUT, **kw)
    if name == "LayerNormLinear":
        return ft.LayerNormLinear(HIDDEN, OUT, **kw)
    if len(options) > 1:
        kw["activation"] = options[1]
    return ft.LayerNormMLP(HIDDEN, OUT, **kw)


def inputs(seed, bad=None):
    x = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(seed))
    x = x.to(torch.bfloat16)
    if bad is not None:
        x[BAD_ROW, 5] = bad
    return x


def fp8_forward(module, recipe, x):
    with torch.no_grad(), ft.autocast(recipe=recipe):
        return module(x)


def assert_only_bad_row_non_finite(y, want_finite, what):
    finite = torch.isfinite(y)
    assert not finite[BAD_ROW].any(), f"{what}: row {BAD_ROW} has finite outputs {y[BAD_ROW]}"
    assert finite[torch.arange(TOKENS) != BAD_ROW].all(), f"{what}: a clean row is not finite"
    assert torch.equal(finite, want_finite), f"{what}: finiteness differs from bf16"


@pytest.mark.parametrize("value", sorted(VALUES))
@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_a_non_finite_input_gives_a_non_finite_output(recipe, layer, value):
    module = make(layer)
    x = inputs(1, VALUES[value])
    with torch.no_grad():
        bf16 = module(x)  # outside autocast: torch's own bf16 math
    y = fp8_forward(module, RECIPES[recipe], x)
    assert_only_bad_row_non_finite(y, torch.isfinite(bf16), f"{recipe} {layer} {value}")


@pytest.mark.parametrize("layer", LAYERS)
def test_delayed_scaling_recovers_after_a_non_finite_step(layer):
    """The non-finite amax enters the history, and the scales it would give
    are not taken (the previous ones are kept): the next finite input gives
    a finite output again."""
    module, recipe = make(layer), DelayedScaling(amax_history_len=4)
    for step, bad in enumerate((None, float("inf"), None, float("nan"), None)):
        x = inputs(10 + step, bad).requires_grad_()
        with ft.autocast(recipe=recipe):
            y = module(x)
        y.backward(torch.randn_like(y) * 1e-2)
        if bad is None:
            assert torch.isfinite(y).all(), f"step {step}: finite input, non-finite output"
        else:
            with torch.no_grad():
                bf16 = module(x)
            assert_only_bad_row_non_finite(y.detach(), torch.isfinite(bf16), f"step {step}")


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_the_cast_saturates_finite_values_only(fmt):
    """+-inf: NaN in E4M3, +-inf in E5M2; NaN: NaN; a finite value beyond
    the max saturates, also when its product with the scale overflows
    float32 (3e38 * 1e3)."""
    x = torch.tensor([float("inf"), -float("inf"), float("nan"), 3e38, -3e38, 1e3])
    data, _, scale_inv = ft.quantize(x, 1e3, fmt)
    max_bits = 0x7E if fmt == "e4m3" else 0x7B
    non_finite = [0x7F, 0x7F, 0x7F] if fmt == "e4m3" else [0x7C, 0xFC, 0x7F]
    assert data.view(torch.uint8).tolist() == non_finite + [max_bits, 0x80 | max_bits, max_bits]
    y = ft.dequantize(data, scale_inv)
    assert torch.isfinite(y).tolist() == [False] * 3 + [True] * 3


def near_flt_max(seed):
    """[256, 256] float32 values in [2^124, FLT_MAX], both signs, FLT_MAX
    itself in every 1x128 tile."""
    g = torch.Generator().manual_seed(seed)
    mag = torch.exp2(torch.rand(256, 256, generator=g, dtype=torch.float64) * 4 + 124)
    x = mag.clamp(max=FLT_MAX).float()
    x[:, ::61] = FLT_MAX
    sign = torch.randint(0, 2, x.shape, generator=g) * 2 - 1
    return x * sign


def assert_close_and_finite(y, x, what):
    """Finite, and within the cast's error: 2^-4 (E4M3) or 2^-3 (E5M2)
    relative rounding, or the saturation above the largest value the scale
    reaches, under 2^-3 of |x|."""
    assert torch.isfinite(y).all(), f"{what}: {(~torch.isfinite(y)).sum()} non-finite values"
    err = (y.double() - x.double()).abs()
    assert (err <= 0.125 * x.double().abs()).all(), f"{what}: max rel err {(err / x.abs()).max()}"


@pytest.mark.parametrize("power_2_scale", [True, False])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_block_scaled_values_near_flt_max_dequantize_finite(fmt, mode, power_2_scale):
    x = near_flt_max(7)
    d, s, cw, cws = ft.quantize_block(x, fmt, mode, True, True, power_2_scale=power_2_scale)
    what = f"{fmt} {mode} power_2_scale={power_2_scale}"
    assert_close_and_finite(ft.dequantize_block(d, s, mode), x, what + " rowwise")
    assert_close_and_finite(ft.dequantize_block(cw, cws, mode, torch.float32, True, x.shape), x,
                            what + " columnwise")
    t = ft.Float8BlockQuantizer(fmt, mode, power_2_scale=power_2_scale)(x)
    assert_close_and_finite(t.dequantize(), x, what + " Float8BlockQuantizer")
