"""A non-finite input stays visible through fp8kit.jax's FP8 layers.

For each recipe (DelayedScaling, CurrentScaling, BlockScaling) and layer
(dense, layernorm_dense, layernorm_mlp), an inf or a NaN in one row of the
input gives a non-finite output in that row, as the same layer in bf16
does, and a finite one elsewhere: the FP8 cast saturates finite values
only (+-inf becomes NaN in E4M3, which has no inf), and a non-finite amax
keeps a usable scale (common/include/fp8kit/quantize.h). The norms of the
fused layers make a row holding an inf NaN already. Also: block-scaled
values next to FLT_MAX dequantize to finite values (the scale floor of
common/include/fp8kit/block_scaling.h)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8kit.jax as fj
from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling

RECIPES = {"delayed": DelayedScaling(), "current": CurrentScaling(), "block": BlockScaling()}
LAYERS = ("dense", "layernorm_dense", "layernorm_dense-rmsnorm", "layernorm_mlp",
          "layernorm_mlp-rmsnorm-swiglu")
VALUES = {"inf": np.inf, "-inf": -np.inf, "nan": np.nan}
TOKENS, HIDDEN, FFN, OUT = 32, 128, 128, 64
BAD_ROW = 3
FLT_MAX = np.finfo(np.float32).max
MODES = ("block_1x128", "block_128x128")


def params(seed=0):
    rng = np.random.default_rng(seed)

    def f32(*shape):
        return jnp.asarray(rng.standard_normal(shape) * 0.1, jnp.float32)

    return {"gamma": 1.0 + f32(HIDDEN), "beta": f32(HIDDEN), "w1": f32(HIDDEN, FFN),
            "b1": f32(FFN), "w2": f32(FFN, OUT), "w2_swiglu": f32(FFN // 2, OUT),
            "b2": f32(OUT), "w": f32(HIDDEN, OUT), "b": f32(OUT)}


def options(layer):
    """(function name, normalization, activation) of a name in LAYERS."""
    name, *rest = layer.split("-")
    return name, rest[0] if rest else "layernorm", rest[1] if len(rest) > 1 else "gelu"


def inputs(seed, bad=None):
    x = np.random.default_rng(seed).standard_normal((TOKENS, HIDDEN)).astype(np.float32)
    if bad is not None:
        x[BAD_ROW, 5] = bad
    return jnp.asarray(x, jnp.bfloat16)


def state_for(layer, recipe):
    if not isinstance(recipe, DelayedScaling):
        return None
    mlp = options(layer)[0] == "layernorm_mlp"
    return fj.DelayedScalingState.create(recipe, num_linears=2 if mlp else 1)


def fp8_layer(layer, recipe, p, x, state):
    name, normalization, activation = options(layer)
    beta = p["beta"] if normalization == "layernorm" else None
    if name == "dense":
        return fj.dense(x, p["w"], p["b"], state=state, recipe=recipe)
    if name == "layernorm_dense":
        return fj.layernorm_dense(x, p["gamma"], beta, p["w"], p["b"],
                                  normalization=normalization, state=state, recipe=recipe)
    w2 = p["w2_swiglu"] if activation == "swiglu" else p["w2"]
    return fj.layernorm_mlp(x, p["gamma"], beta, p["w1"], w2, p["b1"], p["b2"],
                            normalization=normalization, activation=activation, state=state,
                            recipe=recipe)


def bf16_layer(layer, p, x):
    """The same layer without FP8: float32 norm and activation, bf16 GEMMs."""
    name, normalization, activation = options(layer)
    bf = lambda a: a.astype(jnp.bfloat16)  # noqa: E731

    def norm(x):
        x = x.astype(jnp.float32)
        if normalization == "rmsnorm":
            return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-5) * p["gamma"]
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + 1e-5) * p["gamma"] + p["beta"]

    if name == "dense":
        return bf(x) @ bf(p["w"]) + bf(p["b"])
    h = bf(norm(x))
    if name == "layernorm_dense":
        return h @ bf(p["w"]) + bf(p["b"])
    pre = (h @ bf(p["w1"])).astype(jnp.float32) + p["b1"]
    if activation == "swiglu":
        gate, up = jnp.split(pre, 2, axis=-1)
        return bf(jax.nn.silu(gate) * up) @ bf(p["w2_swiglu"]) + bf(p["b2"])
    return bf(jax.nn.gelu(pre, approximate=True)) @ bf(p["w2"]) + bf(p["b2"])


def assert_only_bad_row_non_finite(y, want_finite, what):
    finite = np.isfinite(np.asarray(y, np.float32))
    assert not finite[BAD_ROW].any(), f"{what}: row {BAD_ROW} has finite outputs"
    assert np.delete(finite, BAD_ROW, axis=0).all(), f"{what}: a clean row is not finite"
    np.testing.assert_array_equal(finite, want_finite, err_msg=f"{what}: finiteness vs bf16")


@pytest.mark.parametrize("value", sorted(VALUES))
@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_a_non_finite_input_gives_a_non_finite_output(recipe, layer, value):
    p, x = params(), inputs(1, VALUES[value])
    y = fp8_layer(layer, RECIPES[recipe], p, x, state_for(layer, RECIPES[recipe]))
    want = np.isfinite(np.asarray(bf16_layer(layer, p, x), np.float32))
    assert_only_bad_row_non_finite(y, want, f"{recipe} {layer} {value}")


@pytest.mark.parametrize("layer", LAYERS)
def test_delayed_scaling_recovers_after_a_non_finite_step(layer):
    """The non-finite amax enters the history (through the state's
    cotangent), and the scales it would give are not taken: the next finite
    input gives a finite output again."""
    recipe, p = DelayedScaling(amax_history_len=4), params()
    state = state_for(layer, recipe)
    step = jax.jit(lambda x, s: jax.vjp(lambda s: fp8_layer(layer, recipe, p, x, s), s))
    for i, bad in enumerate((None, np.inf, None, np.nan, None)):
        x = inputs(10 + i, bad)
        y, vjp = step(x, state)
        (state,) = vjp(jnp.full(y.shape, 1e-2, y.dtype))
        if bad is None:
            assert np.isfinite(np.asarray(y, np.float32)).all(), f"step {i}: finite input"
        else:
            want = np.isfinite(np.asarray(bf16_layer(layer, p, x), np.float32))
            assert_only_bad_row_non_finite(y, want, f"step {i}")
        assert np.isfinite(np.asarray(state.scale)).all() and (np.asarray(state.scale) > 0).all()


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_the_cast_saturates_finite_values_only(fmt):
    """+-inf: NaN in E4M3, +-inf in E5M2; NaN: NaN; a finite value beyond
    the max saturates, also when its product with the scale overflows
    float32 (3e38 * 1e3)."""
    x = np.array([np.inf, -np.inf, np.nan, 3e38, -3e38, 1e3], np.float32)
    st = fj.quantize(x, jnp.float32(1e3), fmt)
    max_bits = 0x7E if fmt == "e4m3" else 0x7B
    non_finite = [0x7F, 0x7F, 0x7F] if fmt == "e4m3" else [0x7C, 0xFC, 0x7F]
    bits = np.asarray(st.data).view(np.uint8).tolist()
    assert bits == non_finite + [max_bits, 0x80 | max_bits, max_bits]
    y = np.asarray(fj.dequantize(st))
    assert np.isfinite(y).tolist() == [False] * 3 + [True] * 3


def near_flt_max(seed):
    """[256, 256] float32 values in [2^124, FLT_MAX], both signs, FLT_MAX
    itself in every 1x128 tile."""
    rng = np.random.default_rng(seed)
    x = np.minimum(np.exp2(rng.uniform(124.0, 128.0, (256, 256))), FLT_MAX).astype(np.float32)
    x[:, ::61] = FLT_MAX
    return x * rng.choice(np.float32([-1, 1]), x.shape)


def assert_close_and_finite(y, x, what):
    """Finite, and within the cast's error: 2^-4 (E4M3) or 2^-3 (E5M2)
    relative rounding, or the saturation above the largest value the scale
    reaches, under 2^-3 of |x|."""
    y = np.asarray(y, np.float64)
    assert np.isfinite(y).all(), f"{what}: {(~np.isfinite(y)).sum()} non-finite values"
    err = np.abs(y - x.astype(np.float64))
    assert (err <= 0.125 * np.abs(x.astype(np.float64))).all(), f"{what}: beyond 2^-3"


@pytest.mark.parametrize("power_2_scale", [True, False])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_block_scaled_values_near_flt_max_dequantize_finite(fmt, mode, power_2_scale):
    x = near_flt_max(7)
    st = fj.quantize_block_scaling(x, fmt, True, True, mode, power_2_scale=power_2_scale)
    what = f"{fmt} {mode} power_2_scale={power_2_scale}"
    assert_close_and_finite(fj.dequantize(st), x, what + " rowwise")
    assert_close_and_finite(fj.dequantize(st, from_columnwise=True), x, what + " columnwise")
