"""fp8kit.jax.layernorm_dense and layernorm_mlp under BlockScaling: outputs
and every gradient against the float64 model of the block-quantized layers
(block_fused_layers_model.py: both norms, both activations, bias on and
off, token counts that are not multiples of 8, one and zero tokens, 3-D
inputs, float32, bfloat16 and float16, HYBRID and E4M3), within FP8 tolerance of
the unquantized layer, and the errors; sharded runs are in
test_jax_block_fused_sharding.py, the GPU variant at the end (gpu marker)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import block_fused_layers_model as model
import fp8kit.jax as fj
from fp8kit.recipe import BlockScaling, DelayedScaling, Format

# hidden is two 1x128 tiles; F and N end in a partial tile and block.
HIDDEN, FFN, N = 256, 176, 144


def _params(rng, norm, act, dtype, with_bias):
    n1 = 2 * FFN if act == "swiglu" else FFN
    return dict(
        gamma=jnp.asarray(1 + 0.2 * rng.standard_normal(HIDDEN), dtype),
        beta=jnp.asarray(0.2 * rng.standard_normal(HIDDEN), dtype) if norm == "layernorm"
        else None,
        kernel_1=jnp.asarray(rng.standard_normal((HIDDEN, n1)) / 16, jnp.float32),
        kernel_2=jnp.asarray(rng.standard_normal((FFN, N)) / 12, jnp.float32),
        bias_1=jnp.asarray(0.1 * rng.standard_normal(n1), jnp.float32) if with_bias else None,
        bias_2=jnp.asarray(0.1 * rng.standard_normal(N), jnp.float32) if with_bias else None)


def _f64(a):
    return None if a is None else np.asarray(a, np.float64)


def _rel_err(got, want):
    got = np.asarray(got, np.float64).reshape(want.shape)
    return np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)


def _assert_close(got, want, what, rel):
    if want.size == 0 or not np.any(want):
        np.testing.assert_array_equal(np.asarray(got, np.float64).reshape(want.shape), want,
                                      err_msg=what)
        return
    err = _rel_err(got, want)
    assert err <= rel, f"{what}: relative error {err:.3g} > {rel}"


MLP_NAMES = ("dx", "dgamma", "dbeta", "dkernel_1", "dkernel_2", "dbias_1", "dbias_2")
DENSE_NAMES = ("dx", "dgamma", "dbeta", "dkernel", "dbias")


def _mlp(norm, act, recipe, state=None):
    def f(x, gamma, beta, kernel_1, kernel_2, bias_1, bias_2):
        return fj.layernorm_mlp(x, gamma, beta, kernel_1, kernel_2, bias_1, bias_2,
                                normalization=norm, activation=act, epsilon=1e-5, state=state,
                                recipe=recipe)
    return f


def _dense(norm, recipe, state=None):
    def f(x, gamma, beta, kernel, bias):
        return fj.layernorm_dense(x, gamma, beta, kernel, bias, normalization=norm,
                                  epsilon=1e-5, state=state, recipe=recipe)
    return f


def _run_mlp(recipe, norm, act, lead, dtype, with_bias, seed):
    """The layer's (y, grads in argument order) and the model's (y, grads)
    quantized and not."""
    rng = np.random.default_rng(seed)
    p = _params(rng, norm, act, dtype, with_bias)
    x = jnp.asarray(rng.standard_normal((*lead, HIDDEN)), dtype)
    dy = jnp.asarray(rng.standard_normal((*lead, N)), dtype)
    args = (x, p["gamma"], p["beta"], p["kernel_1"], p["kernel_2"], p["bias_1"], p["bias_2"])
    y, vjp = jax.vjp(jax.jit(_mlp(norm, act, recipe)), *args)
    grads = vjp(dy)
    assert y.shape == (*lead, N) and y.dtype == dtype
    for g, primal in zip(grads, args):
        assert (g is None) == (primal is None)
        if g is not None:
            assert g.shape == primal.shape and g.dtype == primal.dtype
    want = {}
    for quantized in (True, False):
        y_r, (dx, dgamma, dbeta, dk1, db1, dk2, db2) = model.layernorm_mlp(
            _f64(x).reshape(-1, HIDDEN), _f64(p["gamma"]), _f64(p["beta"]), _f64(p["kernel_1"]),
            _f64(p["bias_1"]), _f64(p["kernel_2"]), _f64(p["bias_2"]), _f64(dy).reshape(-1, N),
            norm, act, 1e-5, model.Quantizer(recipe, quantized), dtype, dtype)
        want[quantized] = (y_r, (dx, dgamma, dbeta, dk1, dk2, db1, db2))
    return y, grads, want


def _check_against(names, y, grads, want, rel):
    """y and each gradient (named by `names`, None where not differentiated)
    within relative error `rel` of the model's."""
    y_r, g_r = want
    _assert_close(y, y_r, "y", rel)
    for name, got, w in zip(names, grads, g_r, strict=True):
        if got is not None:
            _assert_close(got, w, name, rel)


# The layer differs from the model by float32-vs-float64 rounding only: now
# and then a value within an ulp of an FP8 rounding midpoint rounds the
# other way, moving its token's row by ~1e-3 (per-tensor scaling of the
# same operands is off by 8% and more).
MODEL_REL = 3e-3
# Exact scales (power_2_scale=False) only with float32 inputs: a bfloat16 x
# and gamma put many normalized values exactly on an FP8 rounding midpoint
# of the exact scale, where the float32 and the float64 norm round apart.
EXACT_SCALES = BlockScaling(fp8_format=Format.E4M3, power_2_scale=False, amax_epsilon=0.5)


@pytest.mark.parametrize("recipe,norm,act,lead,dtype,with_bias", [
    (BlockScaling(), "layernorm", "gelu", (37,), jnp.bfloat16, True),
    (BlockScaling(), "rmsnorm", "swiglu", (2, 9), jnp.bfloat16, True),
    (BlockScaling(), "layernorm", "swiglu", (64,), jnp.float32, False),
    (EXACT_SCALES, "rmsnorm", "gelu", (3, 40), jnp.float32, True),
    (BlockScaling(), "rmsnorm", "gelu", (1,), jnp.bfloat16, True),
    (BlockScaling(), "rmsnorm", "swiglu", (0,), jnp.bfloat16, True),
], ids=["ln-gelu-37", "rms-swiglu-2x9", "ln-swiglu-64-f32", "exact-scales-f32", "one-token",
        "no-tokens"])
def test_mlp_matches_the_block_quantized_model(recipe, norm, act, lead, dtype, with_bias):
    y, grads, want = _run_mlp(recipe, norm, act, lead, dtype, with_bias, seed=lead[0])
    _check_against(MLP_NAMES, y, grads, want[True], MODEL_REL)


@pytest.mark.parametrize("fmt,bound", [(Format.E4M3, 0.08), (Format.HYBRID, 0.12)])
def test_mlp_within_fp8_tolerance_of_the_unquantized_layer(fmt, bound):
    y, grads, want = _run_mlp(BlockScaling(fp8_format=fmt), "rmsnorm", "swiglu", (2, 64),
                              jnp.bfloat16, True, seed=5)
    _check_against(MLP_NAMES, y, grads, want[True], MODEL_REL)
    # E4M3 keeps 3 mantissa bits (E5M2 2): each operand is off by ~2.5%
    # (~5%) per element, which does not average down in relative terms.
    _check_against(MLP_NAMES, y, grads, want[False], bound)


@pytest.mark.parametrize("norm,lead,dtype,with_bias", [
    ("layernorm", (37,), jnp.bfloat16, True),
    ("rmsnorm", (3, 5), jnp.float32, False),
    ("layernorm", (0,), jnp.bfloat16, True),
    ("layernorm", (24,), jnp.float16, True),
])
def test_layernorm_dense_matches_the_block_quantized_model(norm, lead, dtype, with_bias):
    recipe = BlockScaling()
    rng = np.random.default_rng(lead[0])
    p = _params(rng, norm, "gelu", dtype, with_bias)
    x = jnp.asarray(rng.standard_normal((*lead, HIDDEN)), dtype)
    dy = jnp.asarray(rng.standard_normal((*lead, FFN)), dtype)
    args = (x, p["gamma"], p["beta"], p["kernel_1"], p["bias_1"])
    y, vjp = jax.vjp(jax.jit(_dense(norm, recipe)), *args)
    grads = vjp(dy)
    assert y.shape == (*lead, FFN) and y.dtype == dtype
    for quantized, rel in ((True, MODEL_REL), (False, 0.08)):
        want = model.layernorm_dense(
            _f64(x).reshape(-1, HIDDEN), _f64(p["gamma"]), _f64(p["beta"]), _f64(p["kernel_1"]),
            _f64(p["bias_1"]), _f64(dy).reshape(-1, FFN), norm, 1e-5,
            model.Quantizer(recipe, quantized), dtype, dtype)
        _check_against(DENSE_NAMES, y, grads, want, rel)


def test_forward_only_is_the_differentiated_forward():
    rng = np.random.default_rng(7)
    p = _params(rng, "rmsnorm", "swiglu", jnp.bfloat16, True)
    x = jnp.asarray(rng.standard_normal((45, HIDDEN)), jnp.bfloat16)
    args = (x, p["gamma"], p["beta"], p["kernel_1"], p["kernel_2"], p["bias_1"], p["bias_2"])
    f = _mlp("rmsnorm", "swiglu", BlockScaling())
    y_vjp, _ = jax.vjp(f, *args)
    np.testing.assert_array_equal(np.asarray(jax.jit(f)(*args), np.float32),
                                  np.asarray(y_vjp, np.float32))


def test_a_state_is_refused():
    x = jnp.ones((16, 128), jnp.bfloat16)
    gamma, w = jnp.ones(128), jnp.ones((128, 128), jnp.float32)
    with pytest.raises(TypeError, match="layernorm_dense: BlockScaling is stateless; pass "
                                        "state=None"):
        fj.layernorm_dense(x, gamma, None, w, normalization="rmsnorm",
                           state=fj.DelayedScalingState.create(DelayedScaling()),
                           recipe=BlockScaling())
    with pytest.raises(TypeError, match="layernorm_mlp: BlockScaling is stateless; pass "
                                        "state=None"):
        fj.layernorm_mlp(x, gamma, None, w, w, normalization="rmsnorm",
                         state=fj.DelayedScalingState.create(DelayedScaling(), num_linears=2),
                         recipe=BlockScaling())


@pytest.mark.gpu
@pytest.mark.parametrize("norm,act", [("layernorm", "gelu"), ("rmsnorm", "swiglu")])
def test_gpu_matches_the_block_quantized_model(norm, act):
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("needs a GPU")
    if not fj.BUILT_WITH_CUDA or not fj.supports_block_scaled_fp8_gemm(gpu):
        pytest.skip("needs a device with block-scaled FP8 GEMMs (Hopper, cuBLASLt 12.9+)")
    with jax.default_device(gpu):
        y, grads, want = _run_mlp(BlockScaling(), norm, act, (4, 96), jnp.bfloat16, True,
                                  seed=11)
    # Hopper's FP8 tensor cores accumulate with fewer bits than the CPU, and
    # XLA's GPU norm and tanh round differently: more rounding flips.
    _check_against(MLP_NAMES, y, grads, want[True], 1e-2)
