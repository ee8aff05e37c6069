"""Properties of fp8kit.jax's fused layers (layernorm_dense, layernorm_mlp)
under the three recipes, and of dense under BlockScaling: on drawn shapes
(0 tokens included), dtypes, recipes, layouts and values, the output is
finite and within an error bound of the layer computed in float64 without
FP8; one differentiated step gives finite gradients; and under
DelayedScaling the state that step records casts the same input again
exactly as the fresh state's seeding did (the same output bits). Run in a
child process by test_jax_properties.py.

The bound is propagated through the layer from what each step may do:
every FP8 cast rounds a value v (held to within its own bound) to
E4M3 with relative error 2^-4, or absolute error half the smallest
subnormal over the cast's scale, which is at least fp8_max / amax of the
tensor (a 1x128 tile's or a 128x128 block's amax is at most the
tensor's), divided by the recipe's slack: 2^margin for delayed scaling,
2 for a power-of-2 scale, max(amax, amax_epsilon) for an epsilon; the
GEMMs add float32 accumulation (fp8_reference.accumulation_bound) and
the output's rounding; the norm and the activation run in float32 (their
roundings, cancellation in x - mean included, are bounded below), and the
activations are Lipschitz (|gelu'| <= 1.13 for the tanh form, |silu'| <=
1.1). Inputs are moderate (no overflow anywhere, float16 included).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st

import fp8_reference as ref
import fp8kit.jax as fj
from fp8_strategies import arrays, moderate_f32, prop
from fp8kit.recipe import (AmaxReduction, BlockScaling, CurrentScaling, DelayedScaling,
                           Format)
from jax_support import HP, device_or_skip

U = 2.0 ** -24             # float32's unit roundoff
TINY = 2.0 ** -149         # float32's smallest subnormal: what an underflow may lose
E4M3_U = 2.0 ** -4         # the forward format's unit roundoff...
E4M3_HALF_SUB = 2.0 ** -10  # ...and half its smallest subnormal
GELU_LIPSCHITZ, SILU_LIPSCHITZ = 1.13, 1.1
F32_MAX = float(np.finfo(np.float32).max)


@dataclasses.dataclass
class Bounded:
    """A float64 value and a bound on how far the layer's may be from it."""

    value: np.ndarray
    err: np.ndarray

    @property
    def mag(self) -> np.ndarray:
        return np.abs(self.value) + self.err


@dataclasses.dataclass(frozen=True)
class Scaling:
    """An fp8kit recipe and the slack of its scales (module docstring)."""

    recipe: object
    slack: float
    epsilon: float = 0.0

    @property
    def delayed(self) -> bool:
        return isinstance(self.recipe, DelayedScaling)

    @property
    def block(self) -> bool:
        return isinstance(self.recipe, BlockScaling)


@st.composite
def scalings(draw, kinds=("delayed", "current", "block")):
    kind = draw(st.sampled_from(kinds))
    fmt = draw(st.sampled_from([Format.E4M3, Format.HYBRID]))
    if kind == "delayed":
        margin = draw(st.integers(0, 3))
        recipe = DelayedScaling(fp8_format=fmt, margin=margin,
                                amax_history_len=draw(st.integers(1, 4)),
                                amax_reduction=draw(st.sampled_from(list(AmaxReduction))))
        return Scaling(recipe, 2.0 ** margin)
    eps, pow2 = draw(st.sampled_from([0.0, 1e-3])), draw(st.booleans())
    cls = CurrentScaling if kind == "current" else BlockScaling
    return Scaling(cls(fp8_format=fmt, amax_epsilon=eps, power_2_scale=pow2),
                   2.0 if pow2 else 1.0, eps)


# --------------------------------------------------------------- bounds ---

def cast(v: Bounded, scaling: Scaling) -> Bounded:
    """v's FP8 cast in the forward format (E4M3)."""
    mag = v.mag
    amax = max(float(mag.max(initial=0.0)), scaling.epsilon)
    # A tiny amax's scale is clamped to the largest float32.
    floor = E4M3_HALF_SUB * scaling.slack * max(amax / ref.FP8_MAX["e4m3"], 1 / F32_MAX)
    return Bounded(v.value, v.err + E4M3_U * mag + floor)


def rounded(v: Bounded, out: str) -> Bounded:
    """v rounded to the dtype `out` (float32: once more)."""
    return Bounded(v.value, v.err + ref.rounding_bound(v.value, out) + ref.HALF_ULP[out] * v.err)


def gemm(a: Bounded, b: Bounded, bias, out: str, device: str) -> Bounded:
    """a @ b (+ bias, added in float32), rounded to `out`."""
    with np.errstate(under="ignore"):
        want = a.value @ b.value
        err = np.abs(a.value) @ b.err + a.err @ np.abs(b.value) + a.err @ b.err
        err = err + ref.accumulation_bound(a.mag, b.mag, device) + (a.value.shape[1] + 2) * TINY
    if bias is not None:
        want = want + bias
        err = err + 2 * U * (np.abs(want) + np.abs(bias) + err)
    return rounded(Bounded(want, err), out)


def norm(x: np.ndarray, gamma, beta, kind: str, epsilon: float) -> Bounded:
    """LayerNorm / RMSNorm of x [rows, n] in float64, bounded for float32
    arithmetic in any summation order (two passes: mean, then the
    centered squares)."""
    n = x.shape[1]
    eps = float(np.float32(epsilon))
    slop = (n + 8) * U  # a sum of n terms in any order, a division, a few roundings
    if kind == "layernorm":
        mean = x.mean(axis=1, keepdims=True)
        e_mean = slop * np.abs(x).mean(axis=1, keepdims=True) + TINY
    else:
        mean, e_mean = np.zeros((x.shape[0], 1)), np.zeros((x.shape[0], 1))
    d = x - mean
    e_d = e_mean + U * (np.abs(d) + e_mean) + TINY
    var = (d * d).mean(axis=1, keepdims=True)
    d_mag = np.abs(d) + e_d
    e_var = ((2 * np.abs(d) + e_d) * e_d).mean(axis=1, keepdims=True) \
        + slop * (d_mag * d_mag).mean(axis=1, keepdims=True) + n * TINY
    rs = 1 / np.sqrt(var + eps)
    rs_hi = 1 / np.sqrt(np.maximum(var - e_var, 0) + eps) * (1 + 8 * U)
    rs_lo = 1 / np.sqrt(var + e_var + eps) * (1 - 8 * U)
    e_rs = np.maximum(rs_hi - rs, rs - rs_lo)
    xhat = d * rs
    e_xhat = e_d * (rs + e_rs) + np.abs(d) * e_rs + U * d_mag * (rs + e_rs) + TINY
    y = xhat * gamma + (0 if beta is None else beta)
    e_y = np.abs(gamma) * e_xhat
    return Bounded(y, e_y + 3 * U * (np.abs(y) + e_y) + TINY)


def activation(h: Bounded, act: str) -> Bounded:
    """GELU (tanh form) or SwiGLU on [gate | up], computed in float32."""
    if act == "gelu":
        k0, k1 = np.sqrt(2 / np.pi), 0.044715
        a = 0.5 * h.value * (1 + np.tanh(k0 * (h.value + k1 * h.value ** 3)))
        return Bounded(a, GELU_LIPSCHITZ * h.err + 8 * U * (h.mag + np.abs(a)) + TINY)
    f = h.value.shape[1] // 2
    (g, v), (e_g, e_v) = np.split(h.value, [f], axis=1), np.split(h.err, [f], axis=1)
    with np.errstate(over="ignore"):
        silu = g / (1 + np.exp(-g))
    err = SILU_LIPSCHITZ * e_g * (np.abs(v) + e_v) + np.abs(silu) * e_v
    err = err + 8 * U * (np.abs(g) + e_g) * (np.abs(v) + e_v) + TINY
    return Bounded(silu * v, err)


def assert_within(got, want: Bounded, what: str):
    got = np.asarray(got, np.float64).reshape(want.value.shape)
    assert np.isfinite(got).all(), f"{what}: not finite at {np.argwhere(~np.isfinite(got))[:4]}"
    ref.assert_gemm_close(got, want.value, want.err, what)


def assert_finite(tree, what: str):
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        a = np.asarray(leaf, np.float32)
        assert np.isfinite(a).all(), f"{what}{jax.tree_util.keystr(path)} is not finite"


# ------------------------------------------------------------- problems ---

LEADS = [(0,), (1,), (3,), (17,), (2, 5), (0, 4)]


def _param(draw, shape, scale=1.0):
    return draw(arrays(shape, moderate_f32)) * np.float32(scale / 8)


@st.composite
def layer_problems(draw, mlp: bool):
    """Inputs of one layer call: x [tokens, hidden] scaled by 2^-6..2^6,
    gamma and beta in [-2, 2], kernels in [-1, 1] / fan-in (so that no
    output overflows float16), biases in [-1, 1], dy."""
    hidden = 16 * draw(st.integers(1, 3))
    n = 16 * draw(st.integers(1, 3))
    lead = draw(st.sampled_from(LEADS))
    m = int(np.prod(lead))
    gain = np.float32(2.0 ** draw(st.integers(-6, 6)))
    p = dict(hidden=hidden, n=n, lead=lead, x=draw(arrays((m, hidden), moderate_f32)) * gain,
             norm=draw(st.sampled_from(["layernorm", "rmsnorm"])),
             gamma=_param(draw, (hidden,), 2.0),
             epsilon=draw(st.sampled_from([1e-5, 1e-2])), bias=draw(st.booleans()))
    p["beta"] = _param(draw, (hidden,), 2.0) if p["norm"] == "layernorm" else None
    if mlp:
        p["act"] = draw(st.sampled_from(["gelu", "swiglu"]))
        p["paired"] = p["act"] == "swiglu" and draw(st.booleans())
        f = 16 * draw(st.integers(1, 3))
        n1 = 2 * f if p["act"] == "swiglu" else f
        p.update(f=f, k1=_param(draw, (hidden, n1), 1 / hidden), b1=_param(draw, (n1,), 1.0),
                 k2=_param(draw, (f, n), 1 / f))
    else:
        p["k1"] = _param(draw, (hidden, n), 1 / hidden)
        p["b1"] = _param(draw, (n,), 1.0)
    p["b2"] = _param(draw, (n,), 1.0)
    p["dy"] = draw(arrays((m, n), moderate_f32)) * np.float32(2.0 ** -4)
    return p


def _put(dev, dtype):
    return lambda a: None if a is None else jax.device_put(jnp.asarray(a).astype(HP[dtype]), dev)


def _values(a):
    """What the layer received, as float64 (None stays None)."""
    return None if a is None else np.asarray(a, np.float32).astype(np.float64)


def _skip_block(scaling: Scaling, dev) -> bool:
    """Block-scaled GEMMs need a device that has them (Hopper, or the CPU)."""
    return scaling.block and not fj.supports_block_scaled_fp8_gemm(dev)


def _step_and_check(call, args, state, dy, want: Bounded, scaling: Scaling, jit: bool, what):
    """The layer's output without and with differentiation within `want`,
    finite gradients, and under delayed scaling the recorded state casting
    the input again as the fresh one did."""
    primal = jax.jit(call) if jit else call

    def step(args, state):
        y, vjp = jax.vjp(call, args, state)
        return y, vjp(dy)

    y0 = primal(args, state)
    assert_within(y0, want, f"{what} y")
    y, grads = (jax.jit(step) if jit else step)(args, state)
    assert_within(y, want, f"{what} y (differentiated)")
    assert_finite(grads[0], f"{what} gradient ")
    if scaling.delayed:
        new_state = grads[1]
        assert_finite(new_state, f"{what} new state")
        np.testing.assert_array_equal(np.asarray(new_state.seeded), 1.0)
        y1 = primal(args, new_state)
        np.testing.assert_array_equal(np.asarray(y1).view(np.uint8), np.asarray(y0).view(np.uint8),
                                      err_msg=f"{what}: the recorded state casts otherwise than "
                                              "the seeded one")


@prop(max_examples=25, p=layer_problems(mlp=False), scaling=scalings(),
      dtype=st.sampled_from(["float32", "bfloat16", "float16"]), jit=st.booleans())
def check_layernorm_dense_step(device, p, scaling, dtype, jit):
    dev = device_or_skip(device)
    if _skip_block(scaling, dev):
        return
    put = _put(dev, dtype)
    args = dict(x=put(p["x"]).reshape(*p["lead"], p["hidden"]), gamma=put(p["gamma"]),
                beta=put(p["beta"]), kernel=put(p["k1"]), bias=put(p["b1"]) if p["bias"] else None)
    state = fj.DelayedScalingState.create(scaling.recipe) if scaling.delayed else None

    def call(a, s):
        return fj.layernorm_dense(a["x"], a["gamma"], a["beta"], a["kernel"], a["bias"],
                                  normalization=p["norm"], epsilon=p["epsilon"], state=s,
                                  recipe=scaling.recipe)

    v = {k: _values(a) for k, a in args.items()}
    ln = cast(norm(v["x"].reshape(-1, p["hidden"]), v["gamma"], v["beta"], p["norm"],
                   p["epsilon"]), scaling)
    want = gemm(ln, cast(Bounded(v["kernel"], 0 * v["kernel"]), scaling), v["bias"], dtype,
                device)
    dy = put(p["dy"]).reshape(*p["lead"], p["n"])
    _step_and_check(call, args, state, dy, want, scaling, jit, "layernorm_dense")


@prop(max_examples=25, p=layer_problems(mlp=True), scaling=scalings(),
      dtype=st.sampled_from(["float32", "bfloat16", "float16"]), jit=st.booleans())
def check_layernorm_mlp_step(device, p, scaling, dtype, jit):
    dev = device_or_skip(device)
    if _skip_block(scaling, dev):
        return
    put, hidden, f = _put(dev, dtype), p["hidden"], p["f"]
    k1, b1 = p["k1"], p["b1"]
    if p["paired"]:  # [hidden, 2, F]: the gate and up halves of [gate | up]
        k1, b1 = k1.reshape(hidden, 2, f), b1.reshape(2, f)
    args = dict(x=put(p["x"]).reshape(*p["lead"], hidden), gamma=put(p["gamma"]),
                beta=put(p["beta"]), kernel_1=put(k1), kernel_2=put(p["k2"]),
                bias_1=put(b1) if p["bias"] else None, bias_2=put(p["b2"]) if p["bias"] else None)
    state = (fj.DelayedScalingState.create(scaling.recipe, num_linears=2) if scaling.delayed
             else None)

    def call(a, s):
        return fj.layernorm_mlp(a["x"], a["gamma"], a["beta"], a["kernel_1"], a["kernel_2"],
                                a["bias_1"], a["bias_2"], normalization=p["norm"],
                                activation=p["act"], epsilon=p["epsilon"], state=s,
                                recipe=scaling.recipe)

    v = {k: _values(a) for k, a in args.items()}
    n1 = k1.size // hidden
    k1v = v["kernel_1"].reshape(hidden, n1)
    b1v = None if v["bias_1"] is None else v["bias_1"].reshape(n1)
    ln = cast(norm(v["x"].reshape(-1, hidden), v["gamma"], v["beta"], p["norm"], p["epsilon"]),
              scaling)
    h = gemm(ln, cast(Bounded(k1v, 0 * k1v), scaling), b1v, dtype, device)
    a = cast(activation(h, p["act"]), scaling)
    want = gemm(a, cast(Bounded(v["kernel_2"], 0 * v["kernel_2"]), scaling), v["bias_2"], dtype,
                device)
    dy = put(p["dy"]).reshape(*p["lead"], p["n"])
    _step_and_check(call, args, state, dy, want, scaling, jit,
                    f"layernorm_mlp ({p['act']}{', paired' if p['paired'] else ''})")


@prop(max_examples=25, p=layer_problems(mlp=False), scaling=scalings(kinds=("block",)),
      dtype=st.sampled_from(["float32", "bfloat16", "float16"]), jit=st.booleans())
def check_block_scaled_dense_step(device, p, scaling, dtype, jit):
    dev = device_or_skip(device)
    if _skip_block(scaling, dev):
        return
    put = _put(dev, dtype)
    args = dict(x=put(p["x"]).reshape(*p["lead"], p["hidden"]), kernel=put(p["k1"]),
                bias=put(p["b1"]) if p["bias"] else None)

    def call(a, s):
        return fj.dense(a["x"], a["kernel"], a["bias"], state=s, recipe=scaling.recipe)

    v = {k: _values(a) for k, a in args.items()}
    x2d = v["x"].reshape(-1, p["hidden"])
    want = gemm(cast(Bounded(x2d, 0 * x2d), scaling),
                cast(Bounded(v["kernel"], 0 * v["kernel"]), scaling), v["bias"], dtype, device)
    dy = put(p["dy"]).reshape(*p["lead"], p["n"])
    _step_and_check(call, args, None, dy, want, scaling, jit, "dense (BlockScaling)")
