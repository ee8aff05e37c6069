"""The fused layers follow the Linear protocol (common/include/fp8kit/linear.h)
in both front ends: the same x, parameters and dy sequence through
fp8kit.torch.LayerNormLinear / LayerNormMLP and fp8kit.jax.layernorm_dense /
layernorm_mlp gives bit-identical outputs and gradients, step after step, on
the CPU, for delayed, current and block scaling (test_layer_protocol.py
does the same for the plain Linear). Under block scaling both front ends
run the core's norm and activation kernels without their cast, then the
block-scaled Linear's own cast of the result; the GEMMs' bias gradients
are there each framework's float32 column sums (linear.h), equal up to
the summation order."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import fp8kit.jax as fj  # noqa: E402
import fp8kit.torch as ft  # noqa: E402
from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling, Format  # noqa: E402

HIDDEN, WIDTH = 128, 256  # whole 128-wide blocks, so block scaling runs too
STEPS = 3
EPS = 1e-5
RECIPES = [DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=2),
           CurrentScaling(fp8_format=Format.HYBRID)]
IDS = ["delayed", "current"]
LAYERS = [("qkv", "LayerNorm", None), ("qkv", "RMSNorm", None), ("mlp", "LayerNorm", "gelu"),
          ("mlp", "RMSNorm", "swiglu")]
LAYER_IDS = ["LayerNormLinear-LayerNorm", "LayerNormLinear-RMSNorm", "LayerNormMLP-gelu",
             "LayerNormMLP-swiglu"]


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view(np.uint16 if a.dtype.itemsize == 2 else np.uint32)


def _params(rng, kind, norm, act, dtype):
    """The torch layer's parameters by name, float32 NumPy arrays exactly
    representable in `dtype`."""
    if kind == "mlp":
        f1 = 2 * WIDTH if act == "swiglu" else WIDTH
        shapes = {"layer_norm_weight": (HIDDEN,), "fc1_weight": (f1, HIDDEN), "fc1_bias": (f1,),
                  "fc2_weight": (HIDDEN, WIDTH), "fc2_bias": (HIDDEN,)}
    else:
        shapes = {"layer_norm_weight": (HIDDEN,), "weight": (WIDTH, HIDDEN), "bias": (WIDTH,)}
    if norm == "LayerNorm":
        shapes["layer_norm_bias"] = (HIDDEN,)
    out = {}
    for name, shape in shapes.items():
        scale = 0.1 if "weight" in name and "norm" not in name else 0.5
        v = rng.standard_normal(shape) * scale + (1.0 if name == "layer_norm_weight" else 0.0)
        out[name] = torch.tensor(v, dtype=torch.float32).to(dtype).float().numpy()
    return out


def _steps(rng, lead, out_features, dtype):
    seq = []
    for step in range(STEPS):
        gain = 2.0 ** (step - 1)
        x = rng.standard_normal((*lead, HIDDEN)) * 2 * gain
        dy = rng.standard_normal((*lead, out_features)) * 1e-2 / gain
        seq.append(tuple(torch.tensor(a, dtype=torch.float32).to(dtype).float().numpy()
                         for a in (x, dy)))
    return seq


def _torch_run(kind, norm, act, recipe, params, seq, dtype):
    if kind == "mlp":
        layer = ft.LayerNormMLP(HIDDEN, WIDTH, bias=True, normalization=norm, activation=act,
                                eps=EPS, dtype=dtype)
    else:
        layer = ft.LayerNormLinear(HIDDEN, WIDTH, bias=True, normalization=norm, eps=EPS,
                                   dtype=dtype)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            p.copy_(torch.from_numpy(params[name]))
    results = []
    for x, dy in seq:
        layer.zero_grad(set_to_none=True)
        xt = torch.from_numpy(x).to(dtype).requires_grad_()
        with ft.autocast(recipe=recipe):
            y = layer(xt)
        y.backward(torch.from_numpy(dy).to(dtype))
        r = {"y": y.detach(), "dx": xt.grad}
        r.update({f"d_{n}": p.grad for n, p in layer.named_parameters()})
        r = {k: v.float().numpy() for k, v in r.items()}
        if isinstance(recipe, DelayedScaling):
            r.update(_as_jax_state(layer.fp8_state_arrays(recipe)))
        results.append(r)
    return results


# The rows of fp8kit.jax.layernorm_mlp's state holding each Linear's
# input, weight and grad_output slots (its docstring's table).
_JAX_ROWS = {"fc1": [0, 1, 4], "fc2": [2, 3, 5], "linear": [0, 1, 2]}


def _as_jax_state(arrays):
    """A PyTorch layer's fp8_state_arrays() as the fields of the JAX layer's
    DelayedScalingState: the same arrays, the MLP's two Linears stacked."""
    rows = sum(len(_JAX_ROWS[g]) for g in arrays)
    out = {}
    for field in ("amax_history", "scale", "seeded"):
        first = arrays[next(iter(arrays))][field]
        out[field] = np.empty((rows,) + first.shape[1:], np.float32)
        for gemm, a in arrays.items():
            out[field][_JAX_ROWS[gemm]] = a[field]
    return out


def _jax_run(kind, norm, act, recipe, params, seq, dtype):
    jdt = jnp.bfloat16 if dtype == torch.bfloat16 else jnp.float32
    p = {n: jnp.asarray(v, jdt) for n, v in params.items()}
    beta = p.get("layer_norm_bias")
    delayed = isinstance(recipe, DelayedScaling)
    state = (fj.DelayedScalingState.create(recipe, num_linears=2 if kind == "mlp" else 1)
             if delayed else None)
    normalization = norm.lower()
    if kind == "mlp":
        args = (p["layer_norm_weight"], beta, p["fc1_weight"].T, p["fc2_weight"].T,
                p["fc1_bias"], p["fc2_bias"])

        def f(x, gamma, beta, k1, k2, b1, b2, state):
            return fj.layernorm_mlp(x, gamma, beta, k1, k2, b1, b2, normalization=normalization,
                                    activation=act, epsilon=EPS, state=state, recipe=recipe)
        names = ["layer_norm_weight", "layer_norm_bias", "fc1_weight", "fc2_weight", "fc1_bias",
                 "fc2_bias"]
    else:
        args = (p["layer_norm_weight"], beta, p["weight"].T, p["bias"])

        def f(x, gamma, beta, k, b, state):
            return fj.layernorm_dense(x, gamma, beta, k, b, normalization=normalization,
                                      epsilon=EPS, state=state, recipe=recipe)
        names = ["layer_norm_weight", "layer_norm_bias", "weight", "bias"]

    @jax.jit
    def step(x, args, state, dy):
        y, vjp = jax.vjp(f, x, *args, state)
        return y, vjp(dy)

    results = []
    for x, dy in seq:
        y, grads = step(jnp.asarray(x, jdt), args, state, jnp.asarray(dy, jdt))
        r = {"y": y, "dx": grads[0]}
        if delayed:
            state = grads[-1]
            r.update({f: getattr(state, f) for f in ("amax_history", "scale", "seeded")})
        for name, g in zip(names, grads[1:-1]):
            if g is not None:  # no beta for RMSNorm
                r[f"d_{name}"] = g.T if g.ndim == 2 else g  # kernels [in, out] -> torch's [out, in]
        results.append({k: np.asarray(v.astype(jnp.float32)) for k, v in r.items()})
    return results


@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
@pytest.mark.parametrize("kind,norm,act", LAYERS, ids=LAYER_IDS)
@pytest.mark.parametrize("lead", [(2, 16), (5, 7)], ids=["M32", "M35"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
def test_fused_layers_give_the_same_bits(recipe, kind, norm, act, lead, dtype):
    rng = np.random.default_rng(7)
    params = _params(rng, kind, norm, act, dtype)
    seq = _steps(rng, lead, HIDDEN if kind == "mlp" else WIDTH, dtype)
    got_torch = _torch_run(kind, norm, act, recipe, params, seq, dtype)
    got_jax = _jax_run(kind, norm, act, recipe, params, seq, dtype)
    for step, (t, j) in enumerate(zip(got_torch, got_jax)):
        assert t.keys() == j.keys(), step
        for key in t:
            assert t[key].shape == j[key].shape, (step, key)
            np.testing.assert_array_equal(_bits(t[key]), _bits(j[key]),
                                          err_msg=f"step {step}: {key} differs")
        assert np.isfinite(t["y"]).all() and np.abs(t["dx"]).max() > 0


@pytest.mark.parametrize("kind,norm,act", LAYERS, ids=LAYER_IDS)
@pytest.mark.parametrize("lead", [(2, 16), (5, 7)], ids=["M32", "M35"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
def test_block_scaled_fused_layers_give_the_same_bits(kind, norm, act, lead, dtype):
    rng = np.random.default_rng(8)
    params = _params(rng, kind, norm, act, dtype)
    seq = _steps(rng, lead, HIDDEN if kind == "mlp" else WIDTH, dtype)
    got_torch = _torch_run(kind, norm, act, BlockScaling(), params, seq, dtype)
    got_jax = _jax_run(kind, norm, act, BlockScaling(), params, seq, dtype)
    gemm_bias_grads = {"d_bias", "d_fc1_bias", "d_fc2_bias"}
    for step, (t, j) in enumerate(zip(got_torch, got_jax)):
        assert t.keys() == j.keys(), step
        for key in t:
            if key in gemm_bias_grads:  # linear.h: each framework's float32 column sums
                np.testing.assert_allclose(t[key], j[key], rtol=2e-6, atol=1e-6 * np.abs(
                    j[key]).max(), err_msg=f"step {step}: {key} differs beyond summation order")
                continue
            np.testing.assert_array_equal(_bits(t[key]), _bits(j[key]),
                                          err_msg=f"step {step}: {key} differs")
        assert np.isfinite(t["y"]).all() and np.abs(t["dx"]).max() > 0
