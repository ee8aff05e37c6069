"""fp8kit.jax.dense under BlockScaling: forward and gradients against a
float64 model of the same block-quantized math (block_scaling_model.py:
x and dy 1x128 with each GEMM reading its copy, the kernel 128x128),
within FP8 tolerance of the unquantized float64 layer, token counts that
are not multiples of 8 (zero included), every input dtype; a GPU variant
marked gpu. The fused layers under BlockScaling: test_jax_block_fused_layers.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import block_scaling_model as model
import fp8kit.jax as fj
from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling, Format


def _values(t, mode, fmt, columnwise, recipe):
    """float64 values of one copy of block-quantized t (2-D), logical layout."""
    t = np.asarray(t, np.float32)
    stored = t.T if columnwise else t
    q, s = model.quantize_copy(stored, mode, fmt, recipe.amax_epsilon, recipe.power_2_scale)
    v = model.dequantize_copy(q, s, mode, fmt)
    return v.T if columnwise else v


def _reference(recipe, x, w, b, dy):
    """(y, dx, dw, db) in float64 from the block-quantized operands, and the
    magnitudes |.| @ |.| of each GEMM (for the accumulation tolerance)."""
    fwd, bwd = recipe.fp8_format.forward_dtype, recipe.fp8_format.backward_dtype
    k, n = w.shape
    x2, dy2 = np.asarray(x, np.float32).reshape(-1, k), np.asarray(dy, np.float32).reshape(-1, n)
    xr, xc = (_values(x2, "block_1x128", fwd, c, recipe) for c in (False, True))
    gr, gc = (_values(dy2, "block_1x128", bwd, c, recipe) for c in (False, True))
    wq = _values(w, "block_128x128", fwd, False, recipe)
    y = xr @ wq
    if b is not None:
        y = y + np.asarray(jnp.asarray(b).astype(x.dtype if x.dtype != jnp.float16
                                                 else jnp.float32), np.float64)
    out = (y, gr @ wq.T, xc.T @ gc, None if b is None else dy2.astype(np.float64).sum(0))
    mags = (np.abs(xr) @ np.abs(wq), np.abs(gr) @ np.abs(wq).T, np.abs(xc).T @ np.abs(gc))
    return out, mags


def _run(recipe, x, w, b, dy):
    @jax.jit
    def fwd_bwd(x, w, b, dy):
        y, vjp = jax.vjp(lambda x, w, b: fj.dense(x, w, b, recipe=recipe), x, w, b)
        return y, vjp(dy)
    y, (dx, dw, db) = fwd_bwd(x, w, b, dy)
    return y, dx, dw, db


def _inputs(lead, k, n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((*lead, k)), dtype)
    w = jnp.asarray(rng.standard_normal((k, n)) * 0.05, jnp.float32)
    b = jnp.asarray(rng.standard_normal(n) * 0.1, jnp.float32)
    dy = jnp.asarray(rng.standard_normal((*lead, n)), dtype)
    return x, w, b, dy


def _assert_close_to_model(got, want, mags, dtype, accumulation=2.0 ** -18):
    """y and dx rounded once to dtype, dw to float32, after float32 sums."""
    out_eps = {jnp.bfloat16: 2.0 ** -8, jnp.float16: 2.0 ** -11, jnp.float32: 2.0 ** -20}[dtype]
    for name, g, wnt, mag, eps in zip(("y", "dx", "dw"), got, want, mags,
                                      (out_eps, out_eps, 2.0 ** -20)):
        g = np.asarray(g, np.float64).reshape(wnt.shape)
        tol = eps * np.abs(wnt) + accumulation * mag + 1e-30
        assert np.all(np.abs(g - wnt) <= tol), (name, np.max(np.abs(g - wnt) / tol))
    if want[3] is not None:
        np.testing.assert_allclose(np.asarray(got[3], np.float64), want[3], rtol=1e-5,
                                   atol=1e-4)


@pytest.mark.parametrize("lead", [(4, 64), (20,), (3, 7), (0,)])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32, jnp.float16])
def test_matches_the_block_quantized_model(lead, dtype):
    recipe = BlockScaling()
    x, w, b, dy = _inputs(lead, 256, 144, dtype)
    got = _run(recipe, x, w, b, dy)
    want, mags = _reference(recipe, x, w, b, dy)
    assert got[0].shape == (*lead, 144) and got[0].dtype == dtype
    assert got[1].shape == x.shape and got[1].dtype == dtype
    assert got[2].dtype == jnp.float32 and got[3].dtype == jnp.float32
    _assert_close_to_model(got, want, mags, dtype)


@pytest.mark.parametrize("fmt", [Format.E4M3, Format.HYBRID])
def test_within_fp8_tolerance_of_the_float64_layer(fmt):
    recipe = BlockScaling(fp8_format=fmt)
    x, w, b, dy = _inputs((2, 128), 384, 256, jnp.float32, seed=1)
    got = _run(recipe, x, w, b, dy)
    x2, dy2 = np.asarray(x, np.float64).reshape(-1, 384), np.asarray(dy, np.float64).reshape(
        -1, 256)
    w64 = np.asarray(w, np.float64)
    exact = (x2 @ w64 + np.asarray(b, np.float64), dy2 @ w64.T, x2.T @ dy2)
    # E4M3 keeps a relative error of at most 2^-4 per element (E5M2 2^-3
    # for dy), which sums down in a long dot product.
    bound = 0.05 if fmt is Format.E4M3 else 0.08
    for name, g, e in zip(("y", "dx", "dw"), got, exact):
        rel = np.linalg.norm(np.asarray(g, np.float64).reshape(e.shape) - e) / np.linalg.norm(e)
        assert rel < bound, (name, rel)


def test_an_outlier_costs_only_its_own_tile():
    x, w, b, dy = _inputs((64,), 256, 128, jnp.float32, seed=2)
    x = x.at[0, 0].set(1e6)
    exact = np.asarray(x, np.float64) @ np.asarray(w, np.float64) + np.asarray(b, np.float64)
    rest = slice(1, None)

    def err(recipe):
        y = np.asarray(fj.dense(x, w, b, recipe=recipe), np.float64)
        return np.linalg.norm(y[rest] - exact[rest]) / np.linalg.norm(exact[rest])

    assert err(BlockScaling()) < 0.05 and err(CurrentScaling(fp8_format=Format.E4M3)) > 0.5


def test_without_bias_and_with_epsilon_and_exact_scales_off():
    recipe = BlockScaling(amax_epsilon=0.5, power_2_scale=False)
    x, w, _, dy = _inputs((16,), 128, 128, jnp.bfloat16)
    got = _run(recipe, x, w, None, dy)
    want, mags = _reference(recipe, x, w, None, dy)
    assert got[3] is None
    _assert_close_to_model(got, want, mags, jnp.bfloat16)


def test_a_state_is_refused():
    x, w, _, _ = _inputs((16,), 128, 128, jnp.bfloat16)
    with pytest.raises(TypeError, match="BlockScaling is stateless; pass state=None"):
        fj.dense(x, w, state=fj.DelayedScalingState.create(DelayedScaling()),
                 recipe=BlockScaling())


@pytest.mark.gpu
def test_gpu_matches_the_block_quantized_model():
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("needs a GPU")
    if not fj.BUILT_WITH_CUDA or not fj.supports_block_scaled_fp8_gemm(gpu):
        pytest.skip("needs a device with block-scaled FP8 GEMMs (Hopper, cuBLASLt 12.9+)")
    recipe = BlockScaling()
    with jax.default_device(gpu):
        x, w, b, dy = _inputs((4, 256), 512, 384, jnp.bfloat16, seed=3)
        got = _run(recipe, x, w, b, dy)
    want, mags = _reference(recipe, x, w, b, dy)
    # Hopper sums each 128-deep block in less than float32's precision (see
    # test_jax_block_gemm.py): up to 2^-7 of sum |a b|.
    _assert_close_to_model(got, want, mags, jnp.bfloat16, accumulation=2.0 ** -7)
