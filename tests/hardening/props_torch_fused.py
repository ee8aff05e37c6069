"""Properties of the fused layers (fp8kit.torch.LayerNormLinear and
LayerNormMLP) inside fp8kit.torch.autocast, under every recipe
(DelayedScaling, CurrentScaling, BlockScaling): on drawn shapes (0 tokens
and counts that are not multiples of 16 included), dtypes, normalizations
(RMSNorm's eps=None among the eps values), activations and values, the
output is finite and within FP8's error bound of a float64 reference of
the unquantized layer, and the gradients are finite; the layer's FP8
state survives a state_dict round trip (torch.save, torch.load with
weights_only=True): the restored layer trains on as the original does,
bit for bit. Run in a child process by test_torch_properties.py."""

import io
import math

import numpy as np
import torch
from hypothesis import strategies as st

import fp8_reference as ref
import fp8kit.torch as ft
from fp8_strategies import prop, recipes
from props_torch_layers import assert_finite, block_recipes, fp8_gemm_bound
from torch_support import HP, device_or_skip, values

KINDS = ("LayerNormLinear", "LayerNormMLP-gelu", "LayerNormMLP-swiglu")
# Largest slopes of GELU (tanh) and SiLU: how far an error in h moves act(h).
GELU_SLOPE, SILU_SLOPE = 1.13, 1.1
any_recipe = st.one_of(recipes().map(lambda r: r[1]), block_recipes())


@st.composite
def fused_problems(draw):
    """A layer's configuration and shapes, drawn; its values dense (a
    seeded normal draw, scaled by a drawn gain, with now and then one
    outlier in x), which is where FP8's error bound is tight."""
    kind = draw(st.sampled_from(KINDS))
    normalization = draw(st.sampled_from(["LayerNorm", "RMSNorm"]))
    eps = draw(st.sampled_from([1e-5, 1e-3] + ([None] if normalization == "RMSNorm" else [])))
    k, n = 16 * draw(st.integers(1, 3)), 16 * draw(st.integers(1, 3))
    lead = draw(st.sampled_from([(0,), (1,), (3,), (17,), (2, 5), (0, 4)]))
    m = math.prod(lead)
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))

    def normal(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    # Down to inputs whose mean square is below the norms' eps.
    x = normal(m, k, scale=2.0 ** draw(st.integers(-12, 6)))
    if m and draw(st.booleans()):
        x[rng.integers(m), rng.integers(k)] *= 100
    params = {"layer_norm_weight": rng.uniform(0.25, 2.0, k).astype(np.float32)}
    if normalization == "LayerNorm":
        params["layer_norm_bias"] = normal(k, scale=0.1)
    if kind == "LayerNormLinear":
        shapes = {"weight": (n, k), "bias": (n,)}
        out = n
    else:
        rows = 2 * n if kind.endswith("swiglu") else n
        shapes = {"fc1_weight": (rows, k), "fc1_bias": (rows,), "fc2_weight": (k, n),
                  "fc2_bias": (k,)}
        out = k
    bias = draw(st.booleans())
    for name, shape in shapes.items():
        if bias or not name.endswith("bias"):
            params[name] = normal(*shape, scale=shape[-1] ** -0.5)
    return dict(kind=kind, normalization=normalization, eps=eps, k=k, n=n, lead=lead,
                bias=bias, params=params, x=x, dy=normal(m, out))


def make_layer(p, dtype: str, device, params=True):
    kind, k, n = p["kind"], p["k"], p["n"]
    kw = dict(bias=p["bias"], normalization=p["normalization"], eps=p["eps"], device=device,
              dtype=HP[dtype])
    if kind == "LayerNormLinear":
        layer = ft.LayerNormLinear(k, n, **kw)
    else:
        layer = ft.LayerNormMLP(k, n, activation=kind.split("-")[1], **kw)
    if params:
        with torch.no_grad():
            for name, value in p["params"].items():
                getattr(layer, name).copy_(torch.from_numpy(value))
    return layer


def _norm(x, p, gamma, beta, dtype: str):
    """(the normalization in float64, the error allowed for it: float32
    math, then a rounding to dtype where the layer computes it in torch)."""
    k = x.shape[-1]
    eps = np.float64(np.finfo(np.float32).eps if p["eps"] is None else p["eps"])
    mu = x.mean(-1, keepdims=True) if p["normalization"] == "LayerNorm" else np.zeros_like(x[:, :1])
    rs = 1 / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
    n = (x - mu) * rs * gamma + (beta if beta is not None else 0)
    spread = np.abs(gamma) * rs * (np.abs(x).max(-1, keepdims=True, initial=0) + np.abs(mu))
    err = (k + 16) * 2.0 ** -23 * (spread + np.abs(n))
    return n, err + ref.rounding_bound(n, dtype)


def _act(h, eh, activation: str, dtype: str):
    """(act(h) in float64, its error for h known within eh)."""
    if activation == "gelu":
        a = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
        ea = GELU_SLOPE * eh + 2.0 ** -18 * np.abs(h)
    else:
        f = h.shape[-1] // 2
        g, u, eg, eu = h[:, :f], h[:, f:], eh[:, :f], eh[:, f:]
        silu = g / (1 + np.exp(-g))
        a = silu * u
        ea = SILU_SLOPE * eg * (np.abs(u) + eu) + np.abs(silu) * eu + 2.0 ** -18 * np.abs(a)
    return a, ea + ref.rounding_bound(a, dtype)


def reference(p, layer, x2d: np.ndarray, dtype: str, device: str, amax_epsilon: float):
    """(want, bound) of the layer's output on x2d: float64 math on the
    values the layer holds, FP8's error bound on each quantized operand."""
    v = {name: values(t).astype(np.float64) for name, t in layer.named_parameters()}
    n, en = _norm(x2d, p, v["layer_norm_weight"], v.get("layer_norm_bias"), dtype)
    if p["kind"] == "LayerNormLinear":
        return fp8_gemm_bound(n, en, v["weight"], 0 * v["weight"], dtype, device, v.get("bias"),
                              amax_epsilon)
    h, eh = fp8_gemm_bound(n, en, v["fc1_weight"], 0 * v["fc1_weight"], dtype, device,
                           v.get("fc1_bias"), amax_epsilon)
    a, ea = _act(h, eh, p["kind"].split("-")[1], dtype)
    return fp8_gemm_bound(a, ea, v["fc2_weight"], 0 * v["fc2_weight"], dtype, device,
                          v.get("fc2_bias"), amax_epsilon)


def _step(layer, p, recipe, dtype: str, device):
    """One training step on the problem's x and dy: (x, y)."""
    x = torch.from_numpy(p["x"]).to(HP[dtype]).to(device).reshape(*p["lead"], p["k"])
    x.requires_grad_()
    with ft.autocast(recipe=recipe):
        y = layer(x)
    y.backward(torch.from_numpy(p["dy"]).to(HP[dtype]).to(device).reshape(y.shape))
    return x, y


@prop(max_examples=40, p=fused_problems(), recipe=any_recipe,
      dtype=st.sampled_from(["float32", "bfloat16"]))
def check_fused_layer_output_is_close_to_float64(device, p, recipe, dtype):
    dev = device_or_skip(device)
    layer = make_layer(p, dtype, dev)
    x, y = _step(layer, p, recipe, dtype, dev)
    out = y.shape[-1]
    assert y.shape == (*p["lead"], out) and y.dtype == HP[dtype]
    assert_finite(y, "y")
    want, bound = reference(p, layer, values(x).reshape(-1, p["k"]).astype(np.float64), dtype,
                            device, getattr(recipe, "amax_epsilon", 0.0))
    ref.assert_result_close(values(y).reshape(-1, out), want, bound, dtype, "y")
    assert_finite(x.grad, "dx")
    for name, t in layer.named_parameters():
        assert_finite(t.grad, f"d{name}")


def _states(layer) -> list:
    return [st for states in layer.fp8_states.values() for st in states]


@prop(max_examples=25, p=fused_problems(), first=any_recipe, second=any_recipe,
      dtype=st.sampled_from(["float32", "bfloat16"]))
def check_fused_state_round_trips_through_state_dict(device, p, first, second, dtype):
    """Trained under two recipes (one state per GEMM and per-tensor
    recipe), saved, loaded into a fresh layer: the same state, and the
    same bits for the next steps under both recipes."""
    dev = device_or_skip(device)
    layer = make_layer(p, dtype, dev)
    for recipe in (first, second):
        _step(layer, p, recipe, dtype, dev)
    buf = io.BytesIO()
    torch.save(layer.state_dict(), buf)
    buf.seek(0)
    restored = make_layer(p, dtype, dev, params=False)
    restored.load_state_dict(torch.load(buf, weights_only=True))
    got, want = _states(restored), _states(layer)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.recipe == w.recipe and g.seeded == w.seeded
        for name in ("amax_history", "scale", "scale_inv"):
            assert torch.equal(getattr(g, name), getattr(w, name)), name
    for recipe in (second, first):
        for m in (layer, restored):
            m.zero_grad(set_to_none=True)
        (xa, ya), (xb, yb) = _step(layer, p, recipe, dtype, dev), _step(restored, p, recipe,
                                                                        dtype, dev)
        pairs = [("y", ya, yb), ("dx", xa.grad, xb.grad)] + [
            (f"d{name}", t.grad, dict(restored.named_parameters())[name].grad)
            for name, t in layer.named_parameters()]
        for what, a, b in pairs:
            assert torch.equal(a.nan_to_num(), b.nan_to_num()), what
