"""fp8kit.jax.layernorm_mlp with SwiGLU's paired kernel_1 [hidden, 2, F]
(the layout for tensor parallelism) against the same weights as
[hidden, 2F] = [gate | up], unsharded on the CPU.

Under the per-tensor recipes every value is the same sum of the same FP8
products in both layouts (fc1's halves read slices of one cast of
kernel_1, d_ln is one GEMM over both halves), so the output, every
gradient and the delayed-scaling state must come out bit for bit. Under
BlockScaling each half is cast with blocks of its own: with F a multiple
of 128 those are the [hidden, 2F] kernel's blocks, so y and the weight
gradients are bit-equal too, and d_ln (two float32 partial products
added) is equal to float32 rounding. Then the argument errors. Sharded
runs are in test_jax_mlp_tensor_parallel.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8kit.jax as fj
from jax_gpus import gpus
from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling, Format

HIDDEN, FFN, N = 32, 48, 16


def _weights(rng, hidden, ffn, n, norm, with_bias):
    """The MLP's weights with kernel_1 [hidden, 2F] = [gate | up] and bias_1
    [2F]."""
    return dict(
        gamma=jnp.asarray(1 + 0.2 * rng.standard_normal(hidden), jnp.bfloat16),
        beta=jnp.asarray(0.2 * rng.standard_normal(hidden), jnp.bfloat16)
        if norm == "layernorm" else None,
        kernel_1=jnp.asarray(rng.standard_normal((hidden, 2 * ffn)) / 4, jnp.float32),
        kernel_2=jnp.asarray(rng.standard_normal((ffn, n)) / 4, jnp.float32),
        bias_1=jnp.asarray(0.1 * rng.standard_normal(2 * ffn), jnp.float32) if with_bias
        else None,
        bias_2=jnp.asarray(0.1 * rng.standard_normal(n), jnp.float32) if with_bias else None)


def _paired(w):
    """The same weights with kernel_1 [hidden, 2, F] and bias_1 [2, F]."""
    hidden, two_f = w["kernel_1"].shape
    paired = dict(w, kernel_1=w["kernel_1"].reshape(hidden, 2, two_f // 2))
    if w["bias_1"] is not None:
        paired["bias_1"] = w["bias_1"].reshape(2, two_f // 2)
    return paired


def _fwd_bwd(w, x, dy, norm, recipe, state):
    @jax.jit
    def run(x, w, state, dy):
        def f(x, w, state):
            return fj.layernorm_mlp(x, w["gamma"], w["beta"], w["kernel_1"], w["kernel_2"],
                                    w["bias_1"], w["bias_2"], normalization=norm,
                                    activation="swiglu", state=state, recipe=recipe)
        y, vjp = jax.vjp(f, x, w, state)
        return y, vjp(dy)
    return run(x, w, state, dy)


def _as_unpaired(grads):
    """The paired call's (dx, dw, state) with dkernel_1 and dbias_1 in the
    [hidden, 2F] layout."""
    dx, dw, state = grads
    dw = dict(dw, kernel_1=dw["kernel_1"].reshape(dw["kernel_1"].shape[0], -1))
    if dw["bias_1"] is not None:
        dw["bias_1"] = dw["bias_1"].reshape(-1)
    return dx, dw, state


def _bits(a):
    return np.asarray(a).view(np.uint8)


PER_TENSOR = [CurrentScaling(), DelayedScaling(amax_history_len=4),
              DelayedScaling(fp8_format=Format.E4M3, margin=1)]


@pytest.mark.parametrize("recipe", PER_TENSOR, ids=["current", "delayed", "delayed_e4m3"])
@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
@pytest.mark.parametrize("lead,with_bias", [((37,), True), ((2, 9), False), ((1,), True),
                                            ((0,), True)])
def test_paired_equals_concatenated_bit_for_bit(recipe, norm, lead, with_bias):
    rng = np.random.default_rng(len(lead) + 3 * with_bias + 7 * lead[0])
    w = _weights(rng, HIDDEN, FFN, N, norm, with_bias)
    x = jnp.asarray(rng.standard_normal((*lead, HIDDEN)), jnp.bfloat16)
    dy = jnp.asarray(rng.standard_normal((*lead, N)) * 1e-2, jnp.bfloat16)
    state = (fj.DelayedScalingState.create(recipe, num_linears=2)
             if isinstance(recipe, DelayedScaling) else None)
    y, grads = _fwd_bwd(w, x, dy, norm, recipe, state)
    y_p, grads_p = _fwd_bwd(_paired(w), x, dy, norm, recipe, state)
    assert grads_p[1]["kernel_1"].shape == (HIDDEN, 2, FFN)
    np.testing.assert_array_equal(_bits(y_p), _bits(y))
    paths = jax.tree_util.tree_leaves_with_path(grads)
    for (path, want), got in zip(paths, jax.tree_util.tree_leaves(_as_unpaired(grads_p))):
        np.testing.assert_array_equal(_bits(got), _bits(want),
                                      err_msg=jax.tree_util.keystr(path))


def test_paired_delayed_state_over_steps_equals_concatenated():
    recipe = DelayedScaling(amax_history_len=3)
    rng = np.random.default_rng(8)
    w = _weights(rng, HIDDEN, FFN, N, "rmsnorm", True)
    states = [fj.DelayedScalingState.create(recipe, num_linears=2)] * 2
    kernels = [w["kernel_1"], _paired(w)["kernel_1"]]
    for step in range(3):
        x = jnp.asarray(rng.standard_normal((24, HIDDEN)) * (1 + step), jnp.bfloat16)
        dy = jnp.asarray(rng.standard_normal((24, N)) * 10.0 ** -step, jnp.bfloat16)
        for i, layout in enumerate((w, _paired(w))):
            _, (_, dw, states[i]) = _fwd_bwd(dict(layout, kernel_1=kernels[i]), x, dy,
                                             "rmsnorm", recipe, states[i])
            kernels[i] = kernels[i] - 0.5 * dw["kernel_1"]
        for a, b in zip(jax.tree_util.tree_leaves(states[0]), jax.tree_util.tree_leaves(states[1])):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=f"step {step}")
        np.testing.assert_array_equal(np.asarray(kernels[1]).reshape(HIDDEN, -1),
                                      np.asarray(kernels[0]))


@pytest.mark.parametrize("norm,with_bias", [("rmsnorm", True), ("layernorm", False)])
def test_block_scaling_paired_matches_concatenated(norm, with_bias):
    # F = 128: each half is whole 128x128 blocks and 1x128 tiles of its own,
    # as in the [hidden, 2F] layout.
    rng = np.random.default_rng(4)
    hidden, ffn, n = 256, 128, 144
    w = _weights(rng, hidden, ffn, n, norm, with_bias)
    w["kernel_1"], w["kernel_2"] = w["kernel_1"] / 4, w["kernel_2"] / 3
    x = jnp.asarray(rng.standard_normal((40, hidden)), jnp.bfloat16)
    dy = jnp.asarray(rng.standard_normal((40, n)), jnp.bfloat16)
    y, grads = _fwd_bwd(w, x, dy, norm, BlockScaling(), None)
    y_p, grads_p = _fwd_bwd(_paired(w), x, dy, norm, BlockScaling(), None)
    np.testing.assert_array_equal(_bits(y_p), _bits(y))
    dx, dw, _ = grads
    dx_p, dw_p, _ = _as_unpaired(grads_p)
    for name in ("kernel_1", "kernel_2"):
        np.testing.assert_array_equal(_bits(dw_p[name]), _bits(dw[name]), err_msg=name)
    close = [("dx", dx_p, dx)] + [(k, dw_p[k], dw[k]) for k in ("gamma", "beta", "bias_1",
                                                                   "bias_2") if dw[k] is not None]
    for name, got, want in close:
        want = np.asarray(want, np.float32)
        np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=2**-7,
                                   atol=1e-3 * np.abs(want).max(), err_msg=name)


# --- errors before lowering -----------------------------------------------------------------

def _call(**change):
    w = _paired(_weights(np.random.default_rng(0), HIDDEN, FFN, N, "rmsnorm", True))
    kw = dict(x=jnp.ones((4, HIDDEN), jnp.bfloat16), gamma=w["gamma"], beta=None,
              kernel_1=w["kernel_1"], kernel_2=w["kernel_2"], bias_1=w["bias_1"],
              bias_2=w["bias_2"], normalization="rmsnorm", activation="swiglu",
              recipe=CurrentScaling())
    kw.update(change)
    return jax.jit(lambda: fj.layernorm_mlp(**kw)).lower()


@pytest.mark.parametrize("change,match", [
    (dict(activation="gelu"), r"kernel_1 has shape \(32, 2, 48\); expected \[K, N\]"),
    (dict(kernel_1=jnp.ones((HIDDEN, 3, FFN))), r"SwiGLU's paired layout \[hidden, 2, F\]"),
    (dict(kernel_1=jnp.ones((HIDDEN + 16, 2, FFN))), "x has 32 features"),
    (dict(kernel_1=jnp.ones((HIDDEN, 2, 40)), kernel_2=jnp.ones((40, N)), bias_1=None),
     "F=40 must be a positive multiple of 16"),
    (dict(bias_1=jnp.ones((2 * FFN,))), r"bias_1 has shape \(96,\); with the paired kernel_1"),
    (dict(kernel_2=jnp.ones((2 * FFN, N))), "kernel_2 expects K=96"),
])
def test_paired_bad_arguments_raise_before_lowering(change, match):
    with pytest.raises(ValueError, match=match):
        _call(**change)


# --- CUDA against CPU ----------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not gpus(), reason="needs a CUDA build of fp8kit and a GPU")
@pytest.mark.parametrize("recipe", PER_TENSOR[:2], ids=["current", "delayed"])
def test_paired_cuda_matches_cpu(recipe):
    rng = np.random.default_rng(9)
    w = _paired(_weights(rng, HIDDEN, FFN, N, "rmsnorm", True))
    x = jnp.asarray(rng.standard_normal((130, HIDDEN)), jnp.bfloat16)
    dy = jnp.asarray(rng.standard_normal((130, N)) * 1e-2, jnp.bfloat16)
    results = []
    for device in (jax.devices("cpu")[0], gpus()[0]):
        with jax.default_device(device):
            state = (fj.DelayedScalingState.create(recipe, num_linears=2)
                     if isinstance(recipe, DelayedScaling) else None)
            results.append(_fwd_bwd(*jax.device_put((w, x, dy), device), "rmsnorm", recipe,
                                    state))
    # The fused casts are bit-identical; the GEMMs sum in another order on the GPU.
    (y_c, g_c), (y_g, g_g) = results
    for got, want in zip(jax.tree_util.tree_leaves((y_g, g_g[:2])),
                         jax.tree_util.tree_leaves((y_c, g_c[:2]))):
        want = np.asarray(want, np.float32)
        np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=2e-2,
                                   atol=2e-2 * np.abs(want).max())
