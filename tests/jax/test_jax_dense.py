"""fp8kit.jax.dense: forward and gradients against a float64 NumPy model of
the same quantized math, against a bf16 dense within FP8 tolerances, the
delayed-scaling state update, the lowered HLO, vmap and argument errors.
(The MLP training run is in test_jax_dense_training.py.)"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import fp8kit.jax as fj
from fp8kit.recipe import AmaxReduction, CurrentScaling, DelayedScaling, Format

F32 = np.float32
FP8 = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
FP8_MAX = {"e4m3": F32(448.0), "e5m2": F32(57344.0)}


# --- a NumPy model of the layer ----------------------------------------------------

def _q(x, scale, fmt):
    """Quantize-dequantize in float64: the value the FP8 GEMM sees."""
    y = np.clip(np.asarray(x, np.float32) * F32(scale), -FP8_MAX[fmt], FP8_MAX[fmt])
    return y.astype(FP8[fmt]).astype(np.float64) * np.float64(F32(1) / F32(scale))


def _current_scale(t, fmt):
    amax = np.abs(np.asarray(t, np.float32)).max()
    return F32(1) if not amax > 0 else FP8_MAX[fmt] / F32(amax)


def _scales(recipe, state, x, w, dy):
    fwd, bwd = recipe.fp8_format.forward_dtype, recipe.fp8_format.backward_dtype
    if isinstance(recipe, DelayedScaling):
        s = np.asarray(state.scale)
        return (s[0], fwd), (s[1], fwd), (s[2], bwd)
    return (_current_scale(x, fwd), fwd), (_current_scale(w, fwd), fwd), \
        (_current_scale(dy, bwd), bwd)


def _reference(recipe, state, x, w, b, dy):
    """(y, dx, dw, db) in float64 from the quantized operands."""
    (sx, fx), (sw, fw), (sg, fg) = _scales(recipe, state, x, w, dy)
    x2 = np.asarray(x, np.float32).reshape(-1, w.shape[0])
    dy2 = np.asarray(dy, np.float32).reshape(-1, w.shape[1])
    xq, wq, gq = _q(x2, sx, fx), _q(w, sw, fw), _q(dy2, sg, fg)
    # A bf16 output gets the bias in the GEMM epilogue, in bf16.
    y = xq @ wq + (0 if b is None else np.asarray(b.astype(jnp.bfloat16), np.float64))
    mags = (np.abs(xq) @ np.abs(wq), np.abs(gq) @ np.abs(wq).T, np.abs(xq).T @ np.abs(gq))
    db = None if b is None else dy2.astype(np.float64).sum(0)
    return (y, gq @ wq.T, xq.T @ gq, db), mags


def _gpus():
    try:
        return jax.devices("gpu") if fj.BUILT_WITH_CUDA else []
    except RuntimeError:
        return []


def _assert_close(got, want, mag, out_dtype, what, accumulation=1e-5):
    eps = {jnp.dtype(jnp.bfloat16): 2.0**-8, jnp.dtype(jnp.float32): 2.0**-23}[jnp.dtype(out_dtype)]
    got = np.asarray(got, np.float64).reshape(want.shape)
    err = np.abs(got - want)
    tol = eps * np.abs(want) + accumulation * mag + 1e-30
    assert np.all(err <= tol), f"{what}: max excess {np.max(err - tol)}"


def _inputs(rng, lead=(32,), k=64, n=48):
    x = jnp.asarray(rng.standard_normal((*lead, k)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((k, n)) * 0.2, jnp.float32)
    b = jnp.asarray(rng.standard_normal(n) * 0.1, jnp.float32)
    dy = jnp.asarray(rng.standard_normal((*lead, n)) * 1e-3, jnp.bfloat16)
    return x, w, b, dy


RECIPES = [CurrentScaling(), CurrentScaling(fp8_format=Format.E4M3),
           DelayedScaling(amax_history_len=4), DelayedScaling(fp8_format=Format.E4M3, margin=1)]


def _state(recipe, scale=None):
    if not isinstance(recipe, DelayedScaling):
        return None
    st = fj.DelayedScalingState.create(recipe)
    if scale is not None:
        st = fj.DelayedScalingState(st.amax_history, jnp.asarray(scale, jnp.float32))
    return st


# --- numerics ---------------------------------------------------------------------

@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: f"{type(r).__name__}-{r.fp8_format.value}")
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("lead", [(32,), (2, 8)])
def test_forward_and_grads_match_the_quantized_math(recipe, with_bias, lead):
    rng = np.random.default_rng(len(lead) + 2 * with_bias)
    x, w, b, dy = _inputs(rng, lead)
    b = b if with_bias else None
    state = _state(recipe, [3.0, 40.0, 2.0**14])

    def f(x, w, b):
        return fj.dense(x, w, b, state=state, recipe=recipe)

    y, vjp = jax.vjp(jax.jit(f), x, w, b)
    dx, dw, db = vjp(dy)
    (y_r, dx_r, dw_r, db_r), (my, mdx, mdw) = _reference(recipe, state, x, w, b, dy)
    assert y.shape == (*lead, 48) and y.dtype == jnp.bfloat16
    assert dx.dtype == jnp.bfloat16 and dw.dtype == jnp.float32
    _assert_close(y, y_r, my, jnp.bfloat16, "y")
    _assert_close(dx, dx_r, mdx, jnp.bfloat16, "dx")
    _assert_close(dw, dw_r, mdw, jnp.float32, "dw")
    if with_bias:
        np.testing.assert_allclose(np.asarray(db), db_r, rtol=1e-6, atol=1e-9)
    else:
        assert db is None


@pytest.mark.gpu
@pytest.mark.skipif(not _gpus(), reason="needs a CUDA GPU and fp8kit built with CUDA")
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: f"{type(r).__name__}-{r.fp8_format.value}")
def test_gpu_forward_and_grads_match_the_quantized_math(recipe):
    gpu = _gpus()[0]
    x, w, b, dy = _inputs(np.random.default_rng(8), (256,), 512, 384)
    state = _state(recipe, [3.0, 40.0, 2.0**14])

    def fwd_bwd(x, w, b, s, dy):
        y, vjp = jax.vjp(lambda x, w, b, s: fj.dense(x, w, b, state=s, recipe=recipe), x, w, b, s)
        return y, vjp(dy)

    with jax.default_device(gpu):
        y, (dx, dw, db, ds) = jax.jit(fwd_bwd)(*jax.device_put((x, w, b, state, dy), gpu))
    assert y.devices() == {gpu}
    (y_r, dx_r, dw_r, db_r), (my, mdx, mdw) = _reference(recipe, state, x, w, b, dy)
    # Hopper's FP8 tensor cores keep partial sums in less than float32 (the
    # forward GEMM uses fast accumulation): a looser accumulation bound than
    # the CPU reference's.
    for got, want, mag, dt, what in ((y, y_r, my, jnp.bfloat16, "y"),
                                     (dx, dx_r, mdx, jnp.bfloat16, "dx"),
                                     (dw, dw_r, mdw, jnp.float32, "dw")):
        _assert_close(got, want, mag, dt, what, accumulation=2.0**-10)
    np.testing.assert_allclose(np.asarray(db), db_r, rtol=1e-5, atol=1e-6)
    if state is not None:  # the same state update as on the CPU
        cpu = jax.devices("cpu")[0]
        with jax.default_device(cpu):
            _, (_, _, _, ds_cpu) = jax.jit(fwd_bwd)(*jax.device_put((x, w, b, state, dy), cpu))
        np.testing.assert_array_equal(np.asarray(ds.amax_history), np.asarray(ds_cpu.amax_history))
        np.testing.assert_array_equal(np.asarray(ds.scale), np.asarray(ds_cpu.scale))


@pytest.mark.parametrize("recipe", [CurrentScaling(), DelayedScaling()], ids=["current", "delayed"])
def test_close_to_bf16_dense(recipe):
    rng = np.random.default_rng(7)
    x, w, b, dy = _inputs(rng, (64,), 128, 64)
    # Delayed scales as a trained state would have them (from the same tensors' amaxes).
    state = _state(recipe, [448 / np.abs(np.asarray(x, np.float32)).max(), 448 / np.abs(w).max(),
                            57344 / np.abs(np.asarray(dy, np.float32)).max()])
    def fwd_bwd(f):
        @jax.jit
        def run(x, w, b, dy):
            y, vjp = jax.vjp(f, x, w, b)
            return y, vjp(dy)
        return run(x, w, b, dy)

    y8, g8 = fwd_bwd(lambda x, w, b: fj.dense(x, w, b, state=state, recipe=recipe))
    y16, g16 = fwd_bwd(lambda x, w, b: x @ w.astype(jnp.bfloat16) + b.astype(jnp.bfloat16))
    rel = lambda a, c: float(jnp.linalg.norm((a.astype(jnp.float32) - c.astype(jnp.float32))  # noqa: E731
                                             .ravel()) / jnp.linalg.norm(c.astype(jnp.float32).ravel()))
    assert rel(y8, y16) < 0.05          # E4M3 x E4M3
    assert rel(g8[0], g16[0]) < 0.12    # E5M2 gradient x E4M3 kernel
    assert rel(g8[1], g16[1]) < 0.12
    assert rel(g8[2], g16[2]) < 0.02    # bias gradient: a float32 sum, no FP8


# --- delayed-scaling state -------------------------------------------------------------

def _ref_state(recipe, history, scale, amaxes):
    fmts = [recipe.fp8_format.forward_dtype] * 2 + [recipe.fp8_format.backward_dtype]
    h = np.array(history, np.float32)
    h[:, 1:] = h[:, :-1].copy()
    h[:, 0] = amaxes
    s = np.array(scale, np.float32)
    for i in range(3):
        red = h[i].max() if recipe.amax_compute_algo is AmaxReduction.MAX else h[i, 0]
        if np.isfinite(red) and red > 0:
            s[i] = FP8_MAX[fmts[i]] / F32(red) * F32(2.0 ** -recipe.margin)
    return h, s


@pytest.mark.parametrize("recipe", [DelayedScaling(amax_history_len=3),
                                    DelayedScaling(amax_history_len=2, margin=2,
                                                   amax_compute_algo=AmaxReduction.MOST_RECENT)])
def test_state_cotangent_is_the_next_state(recipe):
    rng = np.random.default_rng(3)
    state = fj.DelayedScalingState.create(recipe)
    step = jax.jit(jax.grad(
        lambda w, s, x, dy: jnp.vdot(fj.dense(x, w, state=s, recipe=recipe).astype(jnp.float32),
                                     dy.astype(jnp.float32)), argnums=(0, 1)))
    for i in range(4):
        x, w, _, dy = _inputs(rng, (16,), 32, 32)
        x = x * (i + 1)
        _, new_state = step(w, state, x, dy)
        assert isinstance(new_state, fj.DelayedScalingState)
        amaxes = [np.abs(np.asarray(t, np.float32)).max() for t in (x, w, dy)]
        want_h, want_s = _ref_state(recipe, state.amax_history, state.scale, amaxes)
        np.testing.assert_array_equal(np.asarray(new_state.amax_history), want_h)
        np.testing.assert_array_equal(np.asarray(new_state.scale), want_s)
        state = new_state
    # A forward pass without differentiation reads the state and changes nothing.
    y1 = fj.dense(x, w, state=state, recipe=recipe)
    y2 = fj.dense(x, w, state=state, recipe=recipe)
    np.testing.assert_array_equal(np.asarray(y1), np.asarray(y2))


# --- the lowered program ------------------------------------------------------------

@pytest.mark.parametrize("recipe", [CurrentScaling(), DelayedScaling()], ids=["current", "delayed"])
def test_hlo_is_fp8kit_custom_calls_without_dot(recipe):
    rng = np.random.default_rng(4)
    x, w, b, dy = _inputs(rng)
    state = _state(recipe)

    def fwd_bwd(x, w, b, s, dy):
        y, vjp = jax.vjp(lambda x, w, b, s: fj.dense(x, w, b, state=s, recipe=recipe), x, w, b, s)
        return y, vjp(dy)

    hlo = jax.jit(fwd_bwd).lower(x, w, b, state, dy).as_text()
    assert hlo.count("@fp8kit_gemm") == 3   # forward, dgrad, wgrad
    quant = "@fp8kit_quantize_current_scaling" if state is None else "@fp8kit_quantize("
    assert hlo.count(quant) == 3            # x, kernel, dy
    assert ("@fp8kit_delayed_scaling_update" in hlo) == (state is not None)
    assert "dot_general" not in hlo and "stablehlo.dot" not in hlo
    assert "fp8kit_dequantize" not in hlo


@pytest.mark.parametrize("fast", [False, True])
def test_forward_fast_accumulation_reaches_only_the_forward_gemm(fast):
    rng = np.random.default_rng(4)
    x, w, b, dy = _inputs(rng)
    recipe = CurrentScaling(forward_fast_accumulation=fast)

    def fwd_bwd(x, w, dy):
        y, vjp = jax.vjp(lambda x, w: fj.dense(x, w, recipe=recipe), x, w)
        return y, vjp(dy)

    hlo = jax.jit(fwd_bwd).lower(x, w, dy).as_text()
    gemms = [line for line in hlo.splitlines() if "@fp8kit_gemm" in line]
    split = [("use_split_accumulator = true" in g) for g in gemms]
    # Forward first (no transposes), then dgrad and wgrad: always split.
    assert len(gemms) == 3 and split == [not fast, True, True]
    assert "trans_a = false" in gemms[0] and "trans_b = false" in gemms[0]


def test_recipe_rejects_a_non_bool_forward_fast_accumulation():
    for cls in (CurrentScaling, DelayedScaling):
        with pytest.raises(TypeError, match="forward_fast_accumulation must be a bool"):
            cls(forward_fast_accumulation=1)


# --- transformations -------------------------------------------------------------------

def test_vmap_over_a_batch_axis_is_per_example():
    rng = np.random.default_rng(5)
    xs = jnp.asarray(rng.standard_normal((3, 16, 32)), jnp.bfloat16)
    xs = xs * jnp.asarray([1.0, 10.0, 0.1], jnp.bfloat16)[:, None, None]
    w = jnp.asarray(rng.standard_normal((32, 16)) * 0.2, jnp.float32)
    dys = jnp.asarray(rng.standard_normal((3, 16, 16)), jnp.bfloat16)
    recipe = CurrentScaling()

    def one(x, w, dy):
        y, vjp = jax.vjp(lambda x, w: fj.dense(x, w, recipe=recipe), x, w)
        return (y, *vjp(dy))

    batched = jax.jit(jax.vmap(one, in_axes=(0, None, 0)))(xs, w, dys)
    one = jax.jit(one)
    for i in range(3):
        single = one(xs[i], w, dys[i])
        for bt, s in zip(batched, single):
            np.testing.assert_array_equal(np.asarray(bt[i]), np.asarray(s))


def test_vmap_with_a_batched_delayed_state():
    rng = np.random.default_rng(6)
    recipe = DelayedScaling(amax_history_len=2)
    xs = jnp.asarray(rng.standard_normal((2, 16, 32)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((32, 16)) * 0.2, jnp.float32)
    states = jax.tree_util.tree_map(lambda a: jnp.stack([a, a * 2]),
                                    fj.DelayedScalingState.create(recipe))
    grad = jax.jit(jax.grad(lambda w, s, x: jnp.sum(fj.dense(x, w, state=s, recipe=recipe)
                                                    .astype(jnp.float32)), argnums=(0, 1)))
    dws, new_states = jax.jit(jax.vmap(grad, in_axes=(None, 0, 0)))(w, states, xs)
    for i in range(2):
        s_i = jax.tree_util.tree_map(lambda a: a[i], states)
        dw, ns = grad(w, s_i, xs[i])
        np.testing.assert_array_equal(np.asarray(dws[i]), np.asarray(dw))
        np.testing.assert_array_equal(np.asarray(new_states.scale[i]), np.asarray(ns.scale))


# --- errors --------------------------------------------------------------------------

def test_argument_errors():
    x = jnp.ones((16, 32), jnp.bfloat16)
    w = jnp.ones((32, 16), jnp.float32)
    cur, dly = CurrentScaling(), DelayedScaling(amax_history_len=4)
    with pytest.raises(TypeError, match="recipe must be"):
        fj.dense(x, w, recipe="fp8")
    with pytest.raises(TypeError, match="needs state=DelayedScalingState.create"):
        fj.dense(x, w, recipe=dly)
    with pytest.raises(ValueError, match=r"recipe needs \(3, 4\)"):
        fj.dense(x, w, recipe=dly, state=fj.DelayedScalingState.create(DelayedScaling()))
    with pytest.raises(TypeError, match="CurrentScaling is stateless"):
        fj.dense(x, w, recipe=cur, state=fj.DelayedScalingState.create(dly))
    with pytest.raises(TypeError, match="x has dtype int32"):
        fj.dense(x.astype(jnp.int32), w, recipe=cur)
    with pytest.raises(TypeError, match="kernel has dtype float64|kernel has dtype"):
        fj.dense(x, np.ones((32, 16), np.float64), recipe=cur)
    with pytest.raises(ValueError, match="x has 32 features .* expects K=48"):
        fj.dense(x, jnp.ones((48, 16)), recipe=cur)
    with pytest.raises(ValueError, match="K=24 must be a positive multiple of 16"):
        fj.dense(jnp.ones((16, 24)), jnp.ones((24, 16)), recipe=cur)
    with pytest.raises(ValueError, match="N=8 must be a positive multiple of 16"):
        fj.dense(x, jnp.ones((32, 8)), recipe=cur)
    with pytest.raises(ValueError, match=r"bias has shape \(8,\)"):
        fj.dense(x, w, jnp.ones(8), recipe=cur)
    with pytest.raises(ValueError, match="kernel has shape"):
        fj.dense(x, jnp.ones((32, 16, 1)), recipe=cur)
    # The forward pass takes any token count; differentiating needs a multiple of 16.
    x10 = jnp.ones((10, 32), jnp.bfloat16)
    assert fj.dense(x10, w, recipe=cur).shape == (10, 16)
    with pytest.raises(ValueError, match="token count .* = 10.* multiple of 16"):
        jax.grad(lambda w: jnp.sum(fj.dense(x10, w, recipe=cur).astype(jnp.float32)))(w)
