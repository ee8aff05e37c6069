"""A float64 NumPy model of fp8kit.jax.layernorm_dense and layernorm_mlp,
independent of fp8kit: norm -> quantize (ml_dtypes) -> GEMM -> activation
-> quantize -> GEMM, and the backward through the same quantized operands.
The layer's stored intermediates round to x's dtype where the layer's do
(h and the gradients the GEMMs return), so the model differs from the
layer only by float32-vs-float64 rounding (an FP8 rounding flip here and
there)."""

import math

import ml_dtypes
import numpy as np

F32 = np.float32
FP8 = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
FP8_MAX = {k: float(ml_dtypes.finfo(v).max) for k, v in FP8.items()}
K0, K1 = math.sqrt(2.0 / math.pi), 0.044715


def q(v, scale, fmt):
    """Quantize-dequantize with a float32 scale: the value the FP8 GEMM sees.
    The scaled value is rounded to float32 first, as the kernels compute it,
    then to FP8: ml_dtypes rounds a float64 straight to FP8 since 0.7, which
    differs where the float32 rounding lands on an FP8 tie."""
    scale = F32(scale)
    y = (np.asarray(v, np.float64) * np.float64(scale)).astype(np.float32)
    y = np.clip(y, F32(-FP8_MAX[fmt]), F32(FP8_MAX[fmt]))
    return y.astype(FP8[fmt]).astype(np.float64) * np.float64(F32(1) / scale)


def amax(v) -> float:
    return float(np.abs(np.asarray(v, np.float64)).max(initial=0.0))


def scale_of(a: float, fmt: str, margin: int = 0) -> float:
    """fp8_max / amax / 2**margin (1 for a zero amax)."""
    return FP8_MAX[fmt] / a * 2.0 ** -margin if a > 0 else 1.0


def rounded(v, dtype):
    """v rounded to a JAX dtype (what the layer stores), back in float64."""
    return np.asarray(np.asarray(v, np.float64).astype(np.dtype(dtype)), np.float64)


def norm(x, gamma, beta, kind, eps):
    """(y, xhat, rsigma)."""
    if kind == "layernorm":
        mu = x.mean(-1, keepdims=True)
        rs = 1.0 / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
        xhat = (x - mu) * rs
        return xhat * gamma + beta, xhat, rs
    rs = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    xhat = x * rs
    return xhat * gamma, xhat, rs


def norm_backward(dy, xhat, rs, gamma, kind):
    """(dx, dgamma, dbeta)."""
    g = dy * gamma
    c1 = (xhat * g).mean(-1, keepdims=True)
    if kind == "layernorm":
        dx = (g - xhat * c1 - g.mean(-1, keepdims=True)) * rs
    else:
        dx = (g - xhat * c1) * rs
    return dx, (dy * xhat).sum(0), dy.sum(0)


def activation(h, kind):
    if kind == "gelu":
        return 0.5 * h * (1 + np.tanh(K0 * (h + K1 * h ** 3)))
    f = h.shape[-1] // 2
    gate, up = h[:, :f], h[:, f:]
    return gate / (1 + np.exp(-gate)) * up


def activation_backward(d_a, h, kind):
    if kind == "gelu":
        t = np.tanh(K0 * (h + K1 * h ** 3))
        return d_a * (0.5 * (1 + t) + 0.5 * h * (1 - t * t) * K0 * (1 + 3 * K1 * h * h))
    f = h.shape[-1] // 2
    gate, up = h[:, :f], h[:, f:]
    s = 1 / (1 + np.exp(-gate))
    silu = gate * s
    return np.concatenate([d_a * up * s * (1 + gate * (1 - s)), d_a * silu], axis=-1)


class Scales:
    """The scale of each state row for one step: delayed (the state's, or a
    fresh row's seed from its own amax) or current (from its own amax)."""

    def __init__(self, delayed: bool, fmts, margin=0, scale=None, seeded=None):
        self.delayed, self.fmts, self.margin = delayed, fmts, margin
        self.scale, self.seeded = scale, seeded
        self.amaxes = {}

    def __call__(self, slot: int, v):
        fmt, a = self.fmts[slot], amax(v)
        self.amaxes[slot] = a
        if self.delayed and self.seeded[slot]:
            return q(v, self.scale[slot], fmt)
        return q(v, scale_of(a, fmt, self.margin if self.delayed else 0), fmt)


def mlp(x, gamma, beta, k1, b1, k2, b2, dy, kind, act, eps, scales: Scales, dtype,
        bias_in_epilogue):
    """y and the gradients (dx, dgamma, dbeta, dk1, db1, dk2, db2) of
    layernorm_mlp; slots as its state rows (0..5). x 2-D; dy None: forward
    only. bias_in_epilogue: the bias is rounded to dtype first (16-bit y)."""
    b = lambda v: 0 if v is None else (rounded(v, dtype) if bias_in_epilogue else v)  # noqa: E731
    y_ln, xhat, rs = norm(x, gamma, beta, kind, eps)
    ln_q, k1_q = scales(0, y_ln), scales(1, k1)
    h = rounded(ln_q @ k1_q + b(b1), dtype)
    a_q, k2_q = scales(2, activation(h, act)), scales(3, k2)
    y = rounded(a_q @ k2_q + b(b2), dtype)
    if dy is None:
        return y, None
    dq2 = scales(5, dy)
    d_a = rounded(dq2 @ k2_q.T, dtype)
    dh = activation_backward(d_a, h, act)
    dh_q = scales(4, dh)
    d_ln = rounded(dh_q @ k1_q.T, dtype)
    dx, dgamma, dbeta = norm_backward(d_ln, xhat, rs, gamma, kind)
    return y, (dx, dgamma, dbeta, ln_q.T @ dh_q, dh.sum(0), a_q.T @ dq2, dy.sum(0))


def dense(x, gamma, beta, k, bias, dy, kind, eps, scales: Scales, dtype, bias_in_epilogue):
    """y and the gradients (dx, dgamma, dbeta, dk, db) of layernorm_dense
    (state rows 0 input, 1 kernel, 2 output gradient)."""
    y_ln, xhat, rs = norm(x, gamma, beta, kind, eps)
    ln_q, k_q = scales(0, y_ln), scales(1, k)
    b = 0 if bias is None else (rounded(bias, dtype) if bias_in_epilogue else bias)
    y = rounded(ln_q @ k_q + b, dtype)
    if dy is None:
        return y, None
    dq = scales(2, dy)
    d_ln = rounded(dq @ k_q.T, dtype)
    dx, dgamma, dbeta = norm_backward(d_ln, xhat, rs, gamma, kind)
    return y, (dx, dgamma, dbeta, ln_q.T @ dq, dy.sum(0))


def roll(history, scale, amaxes, fmts, margin):
    """The delayed update of each row with amaxes[slot] (max reduction)."""
    history = np.concatenate([np.asarray(amaxes)[:, None], history[:, :-1]], axis=1)
    reduced = history.max(1)
    new = np.array([FP8_MAX[f] / a * 2.0 ** -margin if a > 0 else s
                    for f, a, s in zip(fmts, reduced, scale)])
    return history, new
