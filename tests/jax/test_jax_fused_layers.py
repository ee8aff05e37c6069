"""fp8kit.jax.layernorm_dense and layernorm_mlp: forward and gradients
against the float64 NumPy model in fused_layers_float64.py (both norms, both
activations, both recipes, bias on and off, token counts 0, 1 and not
multiples of 16, 3-D inputs, under jit), several delayed-scaling steps with
the state against the model's, the fused layer against the unfused
composition (jnp norm + fp8kit.jax.dense + jnp activation + dense), and
argument errors raised before lowering. Sharded runs are in
test_jax_sharding.py; CUDA against CPU at the end (gpu marker)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8kit.jax as fj
from jax_gpus import gpus
from fp8kit.recipe import CurrentScaling, DelayedScaling, Format

from fused_layers_float64 import Scales, roll
import fused_layers_float64 as ref

HIDDEN, FFN, N = 32, 48, 16


def _params(rng, norm, act, dtype=jnp.bfloat16, with_bias=True):
    n1 = 2 * FFN if act == "swiglu" else FFN
    p = dict(gamma=jnp.asarray(1 + 0.2 * rng.standard_normal(HIDDEN), dtype),
             beta=jnp.asarray(0.2 * rng.standard_normal(HIDDEN), dtype) if norm == "layernorm"
             else None,
             kernel_1=jnp.asarray(rng.standard_normal((HIDDEN, n1)) / 4, jnp.float32),
             kernel_2=jnp.asarray(rng.standard_normal((FFN, N)) / 4, jnp.float32))
    p["bias_1"] = jnp.asarray(0.1 * rng.standard_normal(n1), jnp.float32) if with_bias else None
    p["bias_2"] = jnp.asarray(0.1 * rng.standard_normal(N), jnp.float32) if with_bias else None
    return p


def _f64(a):
    return None if a is None else np.asarray(a, np.float64)


def _rel_err(got, want):
    got, want = np.asarray(got, np.float64).reshape(want.shape), np.asarray(want, np.float64)
    return np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)


def _assert_close(got, want, what, rel):
    if want.size == 0 or not np.any(want):
        np.testing.assert_array_equal(np.asarray(got, np.float64).reshape(want.shape), want,
                                      err_msg=what)
        return
    err = _rel_err(got, want)
    assert err <= rel, f"{what}: relative error {err:.3g} > {rel}"


def _fmts(recipe, num_linears):
    f = recipe.fp8_format
    return (f.forward_dtype,) * (2 * num_linears) + (f.backward_dtype,) * num_linears


def _state(recipe, num_linears):
    return (fj.DelayedScalingState.create(recipe, num_linears=num_linears)
            if isinstance(recipe, DelayedScaling) else None)


def _scales(recipe, state, num_linears):
    delayed = isinstance(recipe, DelayedScaling)
    return Scales(delayed, _fmts(recipe, num_linears), getattr(recipe, "margin", 0),
                  None if state is None else np.asarray(state.scale),
                  None if state is None else np.asarray(state.seeded))


def _mlp_call(norm, act, recipe):
    def f(x, gamma, beta, kernel_1, kernel_2, bias_1, bias_2, state):
        return fj.layernorm_mlp(x, gamma, beta, kernel_1, kernel_2, bias_1, bias_2,
                                normalization=norm, activation=act, epsilon=1e-5, state=state,
                                recipe=recipe)
    return f


RECIPES = [CurrentScaling(), DelayedScaling(amax_history_len=4),
           DelayedScaling(fp8_format=Format.E4M3, margin=1)]
RECIPE_IDS = ["current", "delayed", "delayed_e4m3_margin1"]


# --- layernorm_mlp against the model -------------------------------------------------

@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS)
@pytest.mark.parametrize("norm,act", [("layernorm", "gelu"), ("rmsnorm", "swiglu"),
                                      ("layernorm", "swiglu"), ("rmsnorm", "gelu")])
@pytest.mark.parametrize("lead,with_bias", [((37,), True), ((2, 9), False), ((1,), True),
                                            ((0,), True)])
def test_mlp_matches_the_model(recipe, norm, act, lead, with_bias):
    rng = np.random.default_rng(len(lead) + 3 * with_bias + 7 * lead[0])
    p = _params(rng, norm, act, with_bias=with_bias)
    x = jnp.asarray(rng.standard_normal((*lead, HIDDEN)), jnp.bfloat16)
    dy = jnp.asarray(rng.standard_normal((*lead, N)) * 1e-2, jnp.bfloat16)
    state = _state(recipe, 2)
    args = (x, p["gamma"], p["beta"], p["kernel_1"], p["kernel_2"], p["bias_1"], p["bias_2"],
            state)
    y, vjp = jax.vjp(jax.jit(_mlp_call(norm, act, recipe)), *args)
    grads = vjp(dy)
    assert y.shape == (*lead, N) and y.dtype == jnp.bfloat16
    scales = _scales(recipe, state, 2)
    y_r, g_r = ref.mlp(_f64(x).reshape(-1, HIDDEN), _f64(p["gamma"]), _f64(p["beta"]),
                       _f64(p["kernel_1"]), _f64(p["bias_1"]), _f64(p["kernel_2"]),
                       _f64(p["bias_2"]), _f64(dy).reshape(-1, N), norm, act, 1e-5, scales,
                       jnp.bfloat16, True)
    _assert_close(y, y_r, "y", 2e-3)
    names = ("dx", "dgamma", "dbeta", "dkernel_1", "dkernel_2", "dbias_1", "dbias_2")
    dx, dgamma, dbeta, dk1, db1, dk2, db2 = g_r  # in the argument order:
    for name, got, want in zip(names, grads, (dx, dgamma, dbeta, dk1, dk2, db1, db2)):
        if got is None:
            assert name in ("dbeta", "dbias_1", "dbias_2")
            continue
        _assert_close(got, want, name, 1e-2)
    for got, primal in zip(grads[:7], args[:7]):
        if primal is not None:
            assert got.shape == primal.shape and got.dtype == primal.dtype
    if state is not None:  # recorded: each row's newest amax is its tensor's
        new = grads[7]
        assert np.all(np.asarray(new.seeded) == 1)
        amaxes = [scales.amaxes[i] for i in range(6)]
        np.testing.assert_allclose(np.asarray(new.amax_history[:, 0]), amaxes, rtol=3e-2)


@pytest.mark.parametrize("recipe", RECIPES[:2], ids=RECIPE_IDS[:2])
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("lead,with_bias", [((3, 7), True), ((16,), False), ((0,), True)])
def test_layernorm_dense_matches_the_model(recipe, norm, lead, with_bias):
    rng = np.random.default_rng(5 + lead[0])
    p = _params(rng, norm, "gelu", with_bias=with_bias)
    x = jnp.asarray(rng.standard_normal((*lead, HIDDEN)), jnp.float32)
    dy = jnp.asarray(rng.standard_normal((*lead, FFN)) * 1e-2, jnp.float32)
    gamma, beta = p["gamma"].astype(jnp.float32), p["beta"]
    beta = None if beta is None else beta.astype(jnp.float32)
    state = _state(recipe, 1)

    def f(x, gamma, beta, kernel, bias, state):
        return fj.layernorm_dense(x, gamma, beta, kernel, bias, normalization=norm, state=state,
                                  recipe=recipe)

    args = (x, gamma, beta, p["kernel_1"], p["bias_1"], state)
    y, vjp = jax.vjp(jax.jit(f), *args)
    grads = vjp(dy)
    y_r, g_r = ref.dense(_f64(x).reshape(-1, HIDDEN), _f64(gamma), _f64(beta),
                         _f64(p["kernel_1"]), _f64(p["bias_1"]), _f64(dy).reshape(-1, FFN),
                         norm, 1e-5, _scales(recipe, state, 1), jnp.float32, False)
    assert y.shape == (*lead, FFN) and y.dtype == jnp.float32
    _assert_close(y, y_r, "y", 2e-3)
    for name, got, want in zip(("dx", "dgamma", "dbeta", "dkernel", "dbias"), grads, g_r):
        if got is not None:
            _assert_close(got, want, name, 1e-2)


# --- delayed scaling over several steps ----------------------------------------------------

@pytest.mark.parametrize("act", ["gelu", "swiglu"])
def test_delayed_state_over_steps_matches_the_model(act):
    recipe = DelayedScaling(amax_history_len=3, margin=1)
    rng = np.random.default_rng(11)
    p = _params(rng, "rmsnorm", act)
    state = _state(recipe, 2)
    step = jax.jit(jax.grad(
        lambda x, k1, state, dy: jnp.vdot(_mlp_call("rmsnorm", act, recipe)(
            x, p["gamma"], None, k1, p["kernel_2"], p["bias_1"], p["bias_2"], state
        ).astype(jnp.float32), dy), argnums=(1, 2)))
    fmts = _fmts(recipe, 2)
    history, scale, seeded = np.zeros((6, 3)), np.ones(6), np.zeros(6)
    k1 = p["kernel_1"]
    for i in range(4):
        x = jnp.asarray(rng.standard_normal((24, HIDDEN)) * (1 + i), jnp.bfloat16)
        dy = jnp.asarray(rng.standard_normal((24, N)) * 10.0 ** -i, jnp.float32)
        scales = Scales(True, fmts, recipe.margin, scale, seeded)
        ref.mlp(_f64(x), _f64(p["gamma"]), None, _f64(k1), _f64(p["bias_1"]),
                _f64(p["kernel_2"]), _f64(p["bias_2"]), _f64(dy), "rmsnorm", act, 1e-5, scales,
                jnp.bfloat16, True)
        used = np.array([scale[s] if seeded[s] else ref.scale_of(scales.amaxes[s], fmts[s], 1)
                         for s in range(6)])
        history, scale = roll(history, used, [scales.amaxes[s] for s in range(6)], fmts, 1)
        seeded = np.ones(6)
        dk1, state = step(x, k1, state, dy)
        np.testing.assert_allclose(np.asarray(state.amax_history), history, rtol=3e-2,
                                   err_msg=f"step {i}")
        np.testing.assert_allclose(np.asarray(state.scale), scale, rtol=3e-2, err_msg=f"step {i}")
        np.testing.assert_array_equal(np.asarray(state.seeded), seeded)
        k1 = k1 - 0.1 * dk1


def test_a_call_not_differentiated_records_nothing():
    recipe = DelayedScaling()
    rng = np.random.default_rng(2)
    p = _params(rng, "layernorm", "gelu")
    x = jnp.asarray(rng.standard_normal((20, HIDDEN)), jnp.bfloat16)
    state = _state(recipe, 2)
    y1 = jax.jit(_mlp_call("layernorm", "gelu", recipe))(
        x, p["gamma"], p["beta"], p["kernel_1"], p["kernel_2"], None, None, state)
    # The same forward as the differentiated one (a fresh state seeds from
    # each tensor in both).
    y2, _ = jax.vjp(lambda x: _mlp_call("layernorm", "gelu", recipe)(
        x, p["gamma"], p["beta"], p["kernel_1"], p["kernel_2"], None, None, state), x)
    np.testing.assert_array_equal(np.asarray(y1, np.float32), np.asarray(y2, np.float32))


# --- fused against unfused -----------------------------------------------------------------

def _jnp_norm(x, gamma, beta, norm, eps=1e-5):
    x32 = x.astype(jnp.float32)
    if norm == "layernorm":
        mu = x32.mean(-1, keepdims=True)
        y = (x32 - mu) * jax.lax.rsqrt(((x32 - mu) ** 2).mean(-1, keepdims=True) + eps)
        y = y * gamma.astype(jnp.float32) + beta.astype(jnp.float32)
    else:
        y = x32 * jax.lax.rsqrt((x32 * x32).mean(-1, keepdims=True) + eps)
        y = y * gamma.astype(jnp.float32)
    return y.astype(x.dtype)


def _jnp_act(h, act):
    if act == "gelu":
        return jax.nn.gelu(h, approximate=True)
    gate, up = jnp.split(h, 2, axis=-1)
    return jax.nn.silu(gate) * up


@pytest.mark.parametrize("norm,act", [("layernorm", "gelu"), ("rmsnorm", "swiglu")])
def test_fused_equals_the_unfused_composition(norm, act):
    recipe = CurrentScaling()
    rng = np.random.default_rng(3)
    p = _params(rng, norm, act)
    x = jnp.asarray(rng.standard_normal((2, 24, HIDDEN)), jnp.bfloat16)
    dy = jnp.asarray(rng.standard_normal((2, 24, N)) * 1e-2, jnp.bfloat16)

    def unfused(x, gamma, beta, kernel_1, kernel_2, bias_1, bias_2, state):
        ln = _jnp_norm(x, gamma, beta, norm)
        h = fj.dense(ln, kernel_1, bias_1, recipe=recipe)
        return fj.dense(_jnp_act(h, act), kernel_2, bias_2, recipe=recipe)

    args = (x, p["gamma"], p["beta"], p["kernel_1"], p["kernel_2"], p["bias_1"], p["bias_2"],
            None)
    # Two casts rounded independently (the unfused path rounds the norm and
    # the activation to bf16 first): FP8 noise, E5M2's for the gradients.
    y_f, vjp_f = jax.vjp(jax.jit(_mlp_call(norm, act, recipe)), *args)
    y_u, vjp_u = jax.vjp(jax.jit(unfused), *args)
    _assert_close(y_f, np.asarray(y_u, np.float64), "y", 5e-2)
    for i, (gf, gu) in enumerate(zip(vjp_f(dy), vjp_u(dy))):
        if gu is not None:
            _assert_close(gf, np.asarray(gu, np.float64), f"grad {i}", 0.12)


# --- vmap ------------------------------------------------------------------------------

def test_vmap_with_current_scaling_is_one_call_per_example():
    recipe = CurrentScaling()
    rng = np.random.default_rng(4)
    p = _params(rng, "rmsnorm", "swiglu")
    xs = jnp.asarray(rng.standard_normal((3, 20, HIDDEN)), jnp.bfloat16)
    f = lambda x: _mlp_call("rmsnorm", "swiglu", recipe)(  # noqa: E731
        x, p["gamma"], None, p["kernel_1"], p["kernel_2"], p["bias_1"], p["bias_2"], None)
    got = jax.jit(jax.vmap(f))(xs)
    for i in range(3):
        np.testing.assert_array_equal(np.asarray(got[i], np.float32),
                                      np.asarray(jax.jit(f)(xs[i]), np.float32))


def test_vmap_with_delayed_scaling_is_refused():
    recipe = DelayedScaling()
    p = _params(np.random.default_rng(0), "rmsnorm", "gelu")
    state = _state(recipe, 2)
    f = lambda x: _mlp_call("rmsnorm", "gelu", recipe)(  # noqa: E731
        x, p["gamma"], None, p["kernel_1"], p["kernel_2"], None, None, state)
    with pytest.raises(NotImplementedError, match="leading dimensions of x"):
        jax.vmap(f)(jnp.ones((2, 16, HIDDEN), jnp.bfloat16))


# --- errors before lowering ---------------------------------------------------------------

def _good(norm="layernorm", act="gelu"):
    p = _params(np.random.default_rng(0), norm, act)
    return jnp.ones((4, HIDDEN), jnp.bfloat16), p


@pytest.mark.parametrize("change,error,match", [
    (dict(normalization="batchnorm"), ValueError, "normalization='batchnorm'"),
    (dict(activation="relu"), ValueError, "activation='relu'"),
    (dict(beta=None), ValueError, "LayerNorm needs beta"),
    (dict(gamma=jnp.ones((HIDDEN + 16,))), ValueError, "gamma has shape"),
    (dict(kernel_1=jnp.ones((HIDDEN, 40))), ValueError, "N=40 must be a positive multiple"),
    (dict(kernel_1=jnp.ones((HIDDEN + 16, FFN))), ValueError, "expects K=48"),
    (dict(kernel_2=jnp.ones((FFN + 16, N))), ValueError, "kernel_2 expects K=64"),
    (dict(bias_1=jnp.ones((3,))), ValueError, "bias_1 has shape"),
    (dict(x=jnp.ones((4, HIDDEN), jnp.int32)), TypeError, "x"),
    (dict(epsilon=-1.0), ValueError, "epsilon"),
    (dict(recipe=DelayedScaling()), TypeError, r"create\(recipe, num_linears=2\)"),
    (dict(recipe=DelayedScaling(), state=fj.DelayedScalingState.create(DelayedScaling())),
     ValueError, "num_linears=2"),
    (dict(state=fj.DelayedScalingState.create(DelayedScaling(), num_linears=2)), TypeError,
     "CurrentScaling is stateless"),
])
def test_mlp_bad_arguments_raise_before_lowering(change, error, match):
    x, p = _good()
    kw = dict(x=x, gamma=p["gamma"], beta=p["beta"], kernel_1=p["kernel_1"],
              kernel_2=p["kernel_2"], bias_1=None, bias_2=None, normalization="layernorm",
              activation="gelu", epsilon=1e-5, state=None, recipe=CurrentScaling())
    kw.update(change)
    with pytest.raises(error, match=match):
        jax.jit(lambda: fj.layernorm_mlp(**kw)).lower()


def test_swiglu_kernel_1_must_hold_gate_and_up():
    x, p = _good("rmsnorm", "gelu")
    with pytest.raises(ValueError, match="N=48 must be a positive multiple of 32"):
        fj.layernorm_mlp(x, p["gamma"], None, p["kernel_1"], p["kernel_2"],
                         normalization="rmsnorm", activation="swiglu", recipe=CurrentScaling())


def test_layernorm_dense_bad_arguments():
    x, p = _good("rmsnorm")
    with pytest.raises(ValueError, match="RMSNorm has no beta"):
        fj.layernorm_dense(x, p["gamma"], p["gamma"], p["kernel_1"], normalization="rmsnorm",
                           recipe=CurrentScaling())
    with pytest.raises(ValueError, match="K=24 must be a positive multiple of 16"):
        fj.layernorm_dense(jnp.ones((4, 24)), jnp.ones((24,)), None, jnp.ones((24, 16)),
                           normalization="rmsnorm", recipe=CurrentScaling())
    with pytest.raises(ValueError, match=r"needs \(3, 16\), \(3,\) and \(3,\)"):
        fj.layernorm_dense(x, p["gamma"], None, p["kernel_1"], normalization="rmsnorm",
                           state=fj.DelayedScalingState.create(DelayedScaling(), num_linears=2),
                           recipe=DelayedScaling())


# --- CUDA against CPU ----------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not gpus(), reason="needs a CUDA build of fp8kit and a GPU")
@pytest.mark.parametrize("recipe", RECIPES[:2], ids=RECIPE_IDS[:2])
@pytest.mark.parametrize("norm,act", [("layernorm", "gelu"), ("rmsnorm", "swiglu")])
def test_cuda_matches_cpu(recipe, norm, act):
    rng = np.random.default_rng(9)
    p = _params(rng, norm, act)
    x = rng.standard_normal((130, HIDDEN)).astype(np.float32)
    dy = (rng.standard_normal((130, N)) * 1e-2).astype(np.float32)
    results = []
    for device in (jax.devices("cpu")[0], gpus()[0]):
        with jax.default_device(device):
            args = [None if a is None else jax.device_put(jnp.asarray(a), device) for a in
                    (x.astype(jnp.bfloat16), p["gamma"], p["beta"], p["kernel_1"],
                     p["kernel_2"], p["bias_1"], p["bias_2"])]
            state = _state(recipe, 2)
            y, vjp = jax.vjp(jax.jit(_mlp_call(norm, act, recipe)), *args, state)
            results.append((y, vjp(jnp.asarray(dy, jnp.bfloat16))))
    (y_c, g_c), (y_g, g_g) = results
    # The fused norm and activation and their casts are bit-identical; the
    # GEMMs sum in another order on the GPU.
    _assert_close(y_g, np.asarray(y_c, np.float64), "y", 1e-2)
    for i, (a, b) in enumerate(zip(g_g, g_c)):
        if b is not None and not isinstance(b, fj.DelayedScalingState):
            _assert_close(a, np.asarray(b, np.float64), f"grad {i}", 2e-2)
