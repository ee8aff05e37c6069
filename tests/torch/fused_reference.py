"""NumPy reimplementation of the fused ops' documented float32 arithmetic
(common/include/fp8kit/normalization.h, activation.h, fused_cast.h), for
bit-exact tests, and a float64 reference of the fused layers. Independent
of fp8kit: NumPy float32/float64 and ml_dtypes only.

float32 fma has no NumPy primitive: fma32 computes a * b + c exactly in
float64 (the product of two float32 is exact there), keeps the rounding
error of the sum (TwoSum) and rounds once to float32, settling the one case
float64 rounding can spoil (a sum exactly halfway between two float32) by
the sign of that error.
"""

import numpy as np

import fp8_reference as ref

F32 = np.float32
F64 = np.float64


def fma32(a, b, c) -> np.ndarray:
    a, b, c = (np.asarray(v, F32).astype(F64) for v in (a, b, c))
    p = a * b
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)
    r = s.astype(F32)
    r64 = r.astype(F64)
    nb = np.where(s > r64, np.nextafter(r, F32(np.inf)), np.nextafter(r, F32(-np.inf)))
    is_mid = (s != r64) & (s == (r64 + nb.astype(F64)) / 2)
    toward = np.where(err > 0, np.maximum(r, nb), np.minimum(r, nb))
    return np.where(is_mid & (err != 0), toward, r).astype(F32)


# ------------------------------------------------------------ normalization
def row_sum(v: np.ndarray) -> np.ndarray:
    """The documented row sum: chunks of 8 consecutive elements, chunk k to
    lane k mod 32, lanes add in index order, then the tree o = 16..1."""
    rows, hidden = v.shape
    lanes = np.zeros((rows, 32), F32)
    for i in range(hidden):
        k = (i // 8) % 32
        lanes[:, k] = lanes[:, k] + v[:, i]
    o = 16
    while o:
        lanes[:, :o] = lanes[:, :o] + lanes[:, o:2 * o]
        o //= 2
    return lanes[:, 0]


def norm_forward(x, gamma, beta, layernorm: bool, eps: float):
    """(y float32, mean or None, rsigma) in the documented order."""
    x = np.asarray(x, F32)
    h = F32(x.shape[1])
    if layernorm:
        mean = row_sum(x) / h
        d = x - mean[:, None]
        var = row_sum(d * d) / h
    else:
        mean = None
        var = row_sum(x * x) / h
    rsigma = F32(1) / np.sqrt(var + F32(eps))
    xhat = (x - (mean[:, None] if layernorm else F32(0))) * rsigma[:, None]
    g = np.asarray(gamma, F32)[None, :]
    y = fma32(xhat, g, np.asarray(beta, F32)[None, :]) if layernorm else xhat * g
    return y.astype(F32), mean, rsigma


def _tile_sums(v: np.ndarray, tile: int = 32, group: int = 16) -> np.ndarray:
    """Column sums in the norm backward's order: tiles of `tile` rows add
    in order to 0, groups of `group` tile partials add in order to 0, the
    group partials add in order to 0."""
    total = np.zeros(v.shape[1], F32)
    for group_start in range(0, v.shape[0], tile * group):
        group_part = np.zeros(v.shape[1], F32)
        for start in range(group_start, min(group_start + tile * group, v.shape[0]), tile):
            part = np.zeros(v.shape[1], F32)
            for row in v[start:start + tile]:
                part = part + row
            group_part = group_part + part
        total = total + group_part
    return total


def norm_backward(dy, x, mean, rsigma, gamma, layernorm: bool):
    """(dx, dgamma, dbeta) in float32, the documented order."""
    dy, x = np.asarray(dy, F32), np.asarray(x, F32)
    h = F32(x.shape[1])
    xhat = (x - (mean[:, None] if layernorm else F32(0))) * rsigma[:, None]
    g = dy * np.asarray(gamma, F32)[None, :]
    c1 = row_sum(xhat * g) / h
    if layernorm:
        c2 = row_sum(g) / h
        t = fma32(xhat, np.broadcast_to(c1[:, None], xhat.shape),
                  np.broadcast_to(c2[:, None], xhat.shape))
    else:
        t = xhat * c1[:, None]
    dx = (g - t) * rsigma[:, None]
    return dx, _tile_sums(dy * xhat), _tile_sums(dy)


# ---------------------------------------------------------------- activations
def _c(hexstr: str):
    return F32(float.fromhex(hexstr))


TWO_K0, K1, K1X3 = _c("0x1.988454p+0"), _c("0x1.6e4e26p-5"), _c("0x1.12ba9ep-3")
FLT_MAX = np.finfo(F32).max
_EXP_POLY = [_c(h) for h in ("0x1.6d110ap-10", "0x1.120b6ep-7", "0x1.55551ap-5",
                             "0x1.5554dcp-3")]
_ROUND_SHIFT = _c("0x1.8p23")


def _pow2(k) -> np.ndarray:
    return np.ldexp(F32(1), np.asarray(k, np.int32)).astype(F32)


def exp_nonpositive32(y) -> np.ndarray:
    """fp8kit's exp_nonpositive_f32: e^y for y <= 0 (NaN stays NaN)."""
    y = np.asarray(y, F32)
    yc = np.where(y < F32(-104), F32(-104), y)
    t = fma32(yc, _c("0x1.715476p+0"), _ROUND_SHIFT)
    k = t - _ROUND_SHIFT
    r = fma32(k, -_c("0x1.62e4p-1"), yc)
    r = fma32(k, -_c("0x1.7f7d1cp-20"), r)
    p = _EXP_POLY[0]
    for coef in _EXP_POLY[1:] + [F32(0.5), F32(1), F32(1)]:
        p = fma32(p, r, coef)
    kb = np.nan_to_num(k).astype(np.int32) + 150  # k + 150 in [0, 150] (NaN: p is NaN)
    half = kb >> 1
    return ((p * _pow2(half - 75)) * _pow2(kb - half - 75)).astype(F32)


def sigmoid_pair32(x):
    """(sigmoid(x), 1 - sigmoid(x)): the smaller one e / (1 + e) with
    e = e^-|x|, the larger 1 minus that."""
    x = np.asarray(x, F32)
    e = exp_nonpositive32(-np.abs(x))
    smaller = e / (F32(1) + e)
    larger = F32(1) - smaller
    nonneg = x >= 0
    return (np.where(nonneg, larger, smaller).astype(F32),
            np.where(nonneg, smaller, larger).astype(F32))


def sigmoid32(x) -> np.ndarray:
    return sigmoid_pair32(x)[0]


def _gelu_arg(x):
    return (TWO_K0 * fma32(K1, (x * x) * x, x)).astype(F32)


def gelu32(x) -> np.ndarray:
    x = np.asarray(x, F32)
    return (np.maximum(x, -FLT_MAX) * sigmoid32(_gelu_arg(x))).astype(F32)


def gelu_grad32(x) -> np.ndarray:
    x = np.asarray(x, F32)
    s, comp = sigmoid_pair32(_gelu_arg(x))
    c = np.clip(x, F32(-16), F32(16))
    dv = TWO_K0 * fma32(K1X3, c * c, F32(1))
    return fma32(c * (s * comp), dv, s)


def silu32(g) -> np.ndarray:
    g = np.asarray(g, F32)
    return (np.maximum(g, -FLT_MAX) * sigmoid32(g)).astype(F32)


def silu_grad32(g) -> np.ndarray:
    g = np.asarray(g, F32)
    s, comp = sigmoid_pair32(g)
    return fma32(np.clip(g, -FLT_MAX, FLT_MAX), s * comp, s)


def activation_forward(h, activation: str) -> np.ndarray:
    h = np.asarray(h, F32)
    if activation == "gelu":
        return gelu32(h)
    f = h.shape[-1] // 2
    return (silu32(h[..., :f]) * h[..., f:]).astype(F32)


def activation_backward(d_a, h, activation: str) -> np.ndarray:
    d_a, h = np.asarray(d_a, F32), np.asarray(h, F32)
    if activation == "gelu":
        return (d_a * gelu_grad32(h)).astype(F32)
    f = h.shape[-1] // 2
    gate, up = h[..., :f], h[..., f:]
    return np.concatenate([(d_a * up) * silu_grad32(gate), d_a * silu32(gate)], -1).astype(F32)


# ------------------------------------------------------------------ the cast
def seed_scale(amax, fmt: str, margin: int = 0) -> np.float32:
    """A fresh delayed-scaling slot's scale (and current scaling's without
    epsilon) for an amax > 0: (fp8_max / amax) * 2**-margin in float32,
    clamped (fp8_reference.delayed_scale)."""
    return ref.delayed_scale(amax, F32(1), fmt, margin)
