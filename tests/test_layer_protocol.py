"""The Linear layer protocol (common/include/fp8kit/linear.h) is one rule for
both front ends: the same x, weight, bias and dy sequence through
fp8kit.torch.Linear and fp8kit.jax.dense gives bit-identical outputs,
gradients and scaling state, step after step, on the CPU."""

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import fp8kit.jax as fj  # noqa: E402
import fp8kit.torch as ft  # noqa: E402
from fp8kit.recipe import (AmaxReduction, BlockScaling, CurrentScaling,  # noqa: E402
                           DelayedScaling, Format)

K, N = 32, 48
BLOCK_K, BLOCK_N = 128, 256  # block scaling's GEMMs take whole 128-wide blocks
STEPS = 5
RECIPES = [
    DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=3, margin=1),
    DelayedScaling(fp8_format=Format.E4M3, amax_history_len=2,
                   amax_reduction=AmaxReduction.MOST_RECENT),
    CurrentScaling(fp8_format=Format.HYBRID),
    CurrentScaling(fp8_format=Format.E4M3, amax_epsilon=1e-3, power_2_scale=True),
]


def _steps(lead, dtype, seed=0, k=K, n=N):
    """STEPS tuples (x, weight [N, K], bias, dy) as float32 NumPy arrays
    exactly representable in `dtype`, with magnitudes that change from step
    to step (so delayed and current scaling differ)."""
    rng = np.random.default_rng(seed)
    out = []
    for step in range(STEPS):
        gain = 2.0 ** (step - 2)
        x = rng.standard_normal((*lead, k)) * 3 * gain
        w = rng.standard_normal((n, k)) * 0.2 / gain
        b = rng.standard_normal(n)
        dy = rng.standard_normal((*lead, n)) * 1e-3 * gain
        out.append(tuple(torch.tensor(a, dtype=torch.float32).to(dtype).float().numpy()
                         for a in (x, w, b, dy)))
    return out


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view(np.uint16 if a.dtype.itemsize == 2 else np.uint32)


def _torch_run(recipe, seq, dtype):
    n, k = seq[0][1].shape
    layer = ft.Linear(k, n, bias=True, dtype=dtype)
    results = []
    for x, w, b, dy in seq:
        with torch.no_grad():
            layer.weight.copy_(torch.from_numpy(w))
            layer.bias.copy_(torch.from_numpy(b))
        layer.weight.grad = layer.bias.grad = None
        xt = torch.from_numpy(x).to(dtype).requires_grad_()
        with ft.autocast(recipe=recipe):
            y = layer(xt)
        y.backward(torch.from_numpy(dy).to(dtype))
        r = {"y": y.detach(), "dx": xt.grad, "dw": layer.weight.grad, "db": layer.bias.grad}
        r = {k: v.float().numpy() if v.dtype == torch.bfloat16 else v.numpy()
             for k, v in r.items()}
        if isinstance(recipe, DelayedScaling):
            r.update(layer.fp8_state_arrays(recipe)["linear"])
        results.append(r)
    return results


def _jax_run(recipe, seq, dtype):
    jdt = jnp.bfloat16 if dtype == torch.bfloat16 else jnp.float32
    delayed = isinstance(recipe, DelayedScaling)
    state = fj.DelayedScalingState.create(recipe) if delayed else None

    def f(x, kernel, bias, state):
        return fj.dense(x, kernel, bias, state=state, recipe=recipe)

    step = jax.jit(lambda x, k, b, s, dy: (lambda y, vjp: (y, vjp(dy)))(*jax.vjp(f, x, k, b, s)))
    results = []
    for x, w, b, dy in seq:
        y, (dx, dk, db, new_state) = step(jnp.asarray(x, jdt), jnp.asarray(w.T, jdt),
                                          jnp.asarray(b, jdt), state, jnp.asarray(dy, jdt))
        r = {"y": y, "dx": dx, "dw": dk.T, "db": db}
        r = {k: np.asarray(v.astype(jnp.float32) if v.dtype == jnp.bfloat16 else v)
             for k, v in r.items()}
        if delayed:
            state = new_state
            r.update({f: np.asarray(getattr(state, f)) for f in ("amax_history", "scale",
                                                                  "seeded")})
        results.append(r)
    return results


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: repr(r)[:60])
@pytest.mark.parametrize("lead", [(2, 16), (5, 7)], ids=["M32", "M35"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
def test_torch_and_jax_give_the_same_bits(recipe, lead, dtype):
    seq = _steps(lead, dtype)
    got_torch = _torch_run(recipe, seq, dtype)
    got_jax = _jax_run(recipe, seq, dtype)
    for step, (t, j) in enumerate(zip(got_torch, got_jax)):
        assert t.keys() == j.keys()
        for key in t:
            assert t[key].shape == j[key].shape, (step, key)
            np.testing.assert_array_equal(_bits(t[key]), _bits(j[key]),
                                          err_msg=f"step {step}: {key} differs")
        # Not vacuous: the layer did produce finite, nonzero results.
        assert np.isfinite(t["y"]).all() and np.abs(t["dw"]).max() > 0


@pytest.mark.parametrize("lead", [(2, 16), (5, 7)], ids=["M32", "M35"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
def test_block_scaling_gives_the_same_bits(lead, dtype):
    """Block scaling's protocol (linear.h, "Block scaling"): 1x128 / 128x128
    scales and the token count padded to one multiple in both front ends;
    M = 35 is padded. The bias gradient is each framework's own float32
    column sum (linear.h says so), equal up to the summation order."""
    seq = _steps(lead, dtype, k=BLOCK_K, n=BLOCK_N)
    got_torch = _torch_run(BlockScaling(), seq, dtype)
    got_jax = _jax_run(BlockScaling(), seq, dtype)
    for step, (t, j) in enumerate(zip(got_torch, got_jax)):
        assert t.keys() == j.keys() == {"y", "dx", "dw", "db"}
        for key in t:
            assert t[key].shape == j[key].shape, (step, key)
            if key == "db":
                np.testing.assert_allclose(t[key], j[key], rtol=2e-6, atol=1e-6 * np.abs(
                    j[key]).max(), err_msg=f"step {step}: db differs beyond summation order")
                continue
            np.testing.assert_array_equal(_bits(t[key]), _bits(j[key]),
                                          err_msg=f"step {step}: {key} differs")
        assert np.isfinite(t["y"]).all() and np.abs(t["dw"]).max() > 0


def test_delayed_state_is_seeded_and_moves():
    """The protocol's delayed scaling: step 0 is cast with a scale from the
    tensor's own amax (not 1), and each later step's scales come from the
    history; identical in both front ends (checked above), pinned here."""
    recipe = RECIPES[0]
    seq = _steps((2, 16), torch.float32)
    got = _torch_run(recipe, seq, torch.float32)
    x0, w0, _, dy0 = seq[0]
    fmax = {"e4m3": float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max),
            "e5m2": float(ml_dtypes.finfo(ml_dtypes.float8_e5m2).max)}
    amax0 = [np.abs(x0).max(), np.abs(w0).max(), np.abs(dy0).max()]
    fmts = ["e4m3", "e4m3", "e5m2"]
    np.testing.assert_array_equal(got[0]["amax_history"][:, 0], np.float32(amax0))
    want = [np.float32(np.float32(fmax[f]) / np.float32(a)) * np.float32(0.5)
            for f, a in zip(fmts, amax0)]
    np.testing.assert_array_equal(got[0]["scale"], np.float32(want))
    assert not np.array_equal(got[1]["scale"], got[0]["scale"])
