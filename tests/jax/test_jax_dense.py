"""fp8kit.jax.dense: forward and gradients against a float64 NumPy model of
the same quantized math (any token count, zero included), against a bf16
dense within FP8 tolerances, the delayed-scaling protocol (seeding,
recording, a primal call that records nothing), the lowered HLO, vmap and
argument errors. (The MLP training run is in test_jax_dense_training.py.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8_reference as ref
import fp8kit.jax as fj
from jax_gpus import gpus
from fp8kit.recipe import AmaxReduction, CurrentScaling, DelayedScaling, Format

F32 = np.float32


# --- a NumPy model of the layer (scales and casts from fp8_reference) ----------------

def _amax(t):
    return np.abs(np.asarray(t, np.float32)).max(initial=F32(0))


def _seed_scale(t, fmt, margin):
    """The scale an unseeded delayed slot takes from its tensor (the
    delayed update's rule with this amax alone)."""
    return ref.delayed_scale(_amax(t), F32(1), fmt, margin)


def _scales(recipe, state, x, w, dy):
    fwd, bwd = recipe.fp8_format.forward_dtype, recipe.fp8_format.backward_dtype
    fmts = (fwd, fwd, bwd)
    if isinstance(recipe, DelayedScaling):
        s, seeded = np.asarray(state.scale), np.asarray(state.seeded)
        return tuple((s[i] if seeded[i] else _seed_scale(t, fmts[i], recipe.margin), fmts[i])
                     for i, t in enumerate((x, w, dy)))
    return tuple((ref.current_scale(_amax(t), f), f) for t, f in zip((x, w, dy), fmts))


def _reference(recipe, state, x, w, b, dy):
    """(y, dx, dw, db) in float64 from the quantized operands."""
    (sx, fx), (sw, fw), (sg, fg) = _scales(recipe, state, x, w, dy)
    x2 = np.asarray(x, np.float32).reshape(-1, w.shape[0])
    dy2 = np.asarray(dy, np.float32).reshape(-1, w.shape[1])
    xq, wq, gq = (ref.quantize_dequantize(x2, sx, fx), ref.quantize_dequantize(w, sw, fw),
                  ref.quantize_dequantize(dy2, sg, fg))
    # A bf16 output gets the bias in the GEMM epilogue, in bf16.
    y = xq @ wq + (0 if b is None else np.asarray(b.astype(jnp.bfloat16), np.float64))
    mags = (np.abs(xq) @ np.abs(wq), np.abs(gq) @ np.abs(wq).T, np.abs(xq).T @ np.abs(gq))
    db = None if b is None else dy2.astype(np.float64).sum(0)
    return (y, gq @ wq.T, xq.T @ gq, db), mags


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
    """A fresh state, or with `scale` a seeded one holding those scales."""
    if not isinstance(recipe, DelayedScaling):
        return None
    st = fj.DelayedScalingState.create(recipe)
    if scale is not None:
        st = fj.DelayedScalingState(st.amax_history, jnp.asarray(scale, jnp.float32),
                                    jnp.ones((3,), jnp.float32))
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
@pytest.mark.skipif(not gpus(), reason="needs a CUDA GPU and fp8kit built with CUDA")
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: f"{type(r).__name__}-{r.fp8_format.value}")
def test_gpu_forward_and_grads_match_the_quantized_math(recipe):
    gpu = gpus()[0]
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


# --- token counts that are not multiples of 16 ---------------------------------------------

def _fwd_bwd(recipe, x, w, b, state, dy):
    def f(x, w, b, s):
        return fj.dense(x, w, b, state=s, recipe=recipe)

    @jax.jit
    def run(x, w, b, s, dy):
        y, vjp = jax.vjp(f, x, w, b, s)
        return y, vjp(dy)

    return run(x, w, b, state, dy)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: f"{type(r).__name__}-{r.fp8_format.value}")
@pytest.mark.parametrize("lead", [(1,), (10,), (5, 7)], ids=["M1", "M10", "M35"])
def test_any_token_count_matches_the_quantized_math(recipe, lead):
    # wgrad's inner dimension is M: the columnwise copies of x and dy are
    # zero-padded to a multiple of 16, which must add nothing.
    rng = np.random.default_rng(sum(lead))
    x, w, b, dy = _inputs(rng, lead)
    state = _state(recipe)  # fresh: step 0 seeds every slot from its tensor
    y, (dx, dw, db, _) = _fwd_bwd(recipe, x, w, b, state, dy)
    (y_r, dx_r, dw_r, db_r), (my, mdx, mdw) = _reference(recipe, state, x, w, b, dy)
    assert y.shape == (*lead, 48) and dx.shape == x.shape and dw.shape == w.shape
    _assert_close(y, y_r, my, jnp.bfloat16, "y")
    _assert_close(dx, dx_r, mdx, jnp.bfloat16, "dx")
    _assert_close(dw, dw_r, mdw, jnp.float32, "dw")
    np.testing.assert_allclose(np.asarray(db), db_r, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("recipe", [CurrentScaling(), DelayedScaling(amax_history_len=2)],
                         ids=["current", "delayed"])
def test_zero_tokens_give_an_empty_output_and_zero_gradients(recipe):
    x, w, b, dy = _inputs(np.random.default_rng(9), (0,))
    y, (dx, dw, db, _) = _fwd_bwd(recipe, x, w, b, _state(recipe), dy)
    assert y.shape == (0, 48) and dx.shape == (0, 64)
    np.testing.assert_array_equal(np.asarray(dw), np.zeros(w.shape, np.float32))
    np.testing.assert_array_equal(np.asarray(db), np.zeros(b.shape, np.float32))


# --- delayed-scaling protocol ---------------------------------------------------------

def _ref_state(recipe, history, scale, amaxes):
    """The recorded update (fp8_reference.delayed_update): roll each amax in,
    reduce, rescale."""
    fmts = [recipe.fp8_format.forward_dtype] * 2 + [recipe.fp8_format.backward_dtype]
    h, s, _ = ref.delayed_update(history, amaxes, scale, fmts, recipe.margin,
                                 recipe.amax_reduction)
    return h, s


@pytest.mark.parametrize("recipe", [DelayedScaling(amax_history_len=3),
                                    DelayedScaling(amax_history_len=2, margin=2,
                                                   amax_reduction=AmaxReduction.MOST_RECENT)])
def test_state_cotangent_is_the_next_state(recipe):
    rng = np.random.default_rng(3)
    state = fj.DelayedScalingState.create(recipe)

    @jax.jit
    def step(w, s, x, dy):
        y, vjp = jax.vjp(lambda w, s: fj.dense(x, w, state=s, recipe=recipe), w, s)
        return y, vjp(dy)[1]

    for i in range(4):
        x, w, _, dy = _inputs(rng, (16,), 32, 32)
        x = x * (i + 1)
        y, new_state = step(w, state, x, dy)
        assert isinstance(new_state, fj.DelayedScalingState)
        # Step 0 is cast with the seed scales (from x, w, dy themselves), not 1.
        (y_r, _, _, _), (my, _, _) = _reference(recipe, state, x, w, None, dy)
        _assert_close(y, y_r, my, jnp.bfloat16, f"y at step {i}")
        amaxes = [np.abs(np.asarray(t, np.float32)).max() for t in (x, w, dy)]
        want_h, want_s = _ref_state(recipe, state.amax_history, state.scale, amaxes)
        np.testing.assert_array_equal(np.asarray(new_state.amax_history), want_h)
        np.testing.assert_array_equal(np.asarray(new_state.scale), want_s)
        np.testing.assert_array_equal(np.asarray(new_state.seeded), np.ones(3, np.float32))
        state = new_state


def test_a_fresh_state_seeds_step_zero_from_the_tensors():
    # Changed on purpose with the layer protocol: step 0 used to be cast with
    # scale 1; now each slot's first cast uses fp8_max / its own amax.
    recipe = DelayedScaling(amax_history_len=4, margin=1)
    x, w, b, dy = _inputs(np.random.default_rng(11), (32,))
    fresh = fj.DelayedScalingState.create(recipe)
    y, (_, _, _, new_state) = _fwd_bwd(recipe, x, w, b, fresh, dy)
    seeds = [_seed_scale(t, f, 1) for t, f in zip((x, w, dy), ("e4m3", "e4m3", "e5m2"))]
    (y_r, _, _, _), (my, _, _) = _reference(recipe, fresh, x, w, b, dy)
    _assert_close(y, y_r, my, jnp.bfloat16, "y")
    # One step of history: the recorded scale is the seed scale itself.
    np.testing.assert_array_equal(np.asarray(new_state.scale), np.float32(seeds))
    unit = fj.DelayedScalingState(fresh.amax_history, fresh.scale, jnp.ones(3, jnp.float32))
    y_unit, _ = _fwd_bwd(recipe, x, w, b, unit, dy)
    assert not np.array_equal(np.asarray(y_unit), np.asarray(y))  # seeding did something


@pytest.mark.parametrize("seeded", [0.0, 1.0], ids=["fresh", "seeded"])
def test_a_primal_call_records_nothing(seeded):
    recipe = DelayedScaling(amax_history_len=2)
    x, w, b, _ = _inputs(np.random.default_rng(12), (16,))
    state = fj.DelayedScalingState(jnp.asarray([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], jnp.float32),
                                   jnp.asarray([2.0, 8.0, 0.5], jnp.float32),
                                   jnp.full((3,), seeded, jnp.float32))
    before = jax.tree_util.tree_map(np.array, state)
    f = jax.jit(lambda x, w, b, s: fj.dense(x, w, b, state=s, recipe=recipe))
    y = f(x, w, b, state)
    # Cast with the state's scales (or, fresh, the seed scales); state intact.
    (y_r, _, _, _), (my, _, _) = _reference(recipe, state, x, w, b, np.zeros((16, 48)))
    _assert_close(y, y_r, my, jnp.bfloat16, "y")
    for got, want in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(before)):
        np.testing.assert_array_equal(np.asarray(got), want)
    hlo = f.lower(x, w, b, state).as_text()
    # One read-only cast (the target that returns no state), no recording one.
    assert hlo.count("@fp8kit_quantize_delayed(") == 1
    assert "@fp8kit_quantize_delayed_update" not in hlo


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
    if state is None:
        assert hlo.count("@fp8kit_quantize_current_scaling") == 3   # x, kernel, dy
    else:  # x and kernel in one recorded call, dy (with the bias gradient) in another
        calls = [line for line in hlo.splitlines() if "@fp8kit_quantize_delayed_update" in line]
        assert len(calls) == 2 and "@fp8kit_quantize_delayed(" not in hlo  # both record
        assert "@fp8kit_quantize(" not in hlo and "@fp8kit_delayed_scaling_update" not in hlo
    assert "reduce" not in hlo.replace("amax_reduction", "")  # db comes from dy's cast
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
    with pytest.raises(ValueError, match=r"seeded of shapes .* needs \(3, 4\)"):
        fj.dense(x, w, recipe=dly, state=fj.DelayedScalingState(
            jnp.zeros((3, 4)), jnp.ones(3), jnp.zeros(2)))
