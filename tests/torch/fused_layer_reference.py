"""A float64 NumPy reference of the fused layers' FP8 math for the first
step (a fresh delayed-scaling slot and current scaling both take each
tensor's scale from its own amax):

    norm -> quantize (ml_dtypes) -> GEMM -> activation -> quantize -> GEMM

and its backward, with elementwise error bounds derived from where the
layer may legitimately differ: the GEMMs accumulate in float32 on the CPU
(the reference in float64), and a value computed from a GEMM output (the
activation, dh) may then round to the neighbouring FP8 value, an error of
at most one FP8 ulp: 2**-3 of the value for E4M3, 2**-2 for E5M2, or the
format's smallest subnormal step.
"""

import numpy as np

import fp8_reference as ref
import fused_reference as R

F32 = np.float32
ULP = {"e4m3": 2.0 ** -3, "e5m2": 2.0 ** -2}          # one ulp, relative
SUBNORMAL = {"e4m3": 2.0 ** -9, "e5m2": 2.0 ** -16}   # smallest step, in FP8 units
ACC = 2.0 ** -22  # float32 accumulation over the reduction, per unit of |A| @ |B|, per term


def quantize(v32: np.ndarray, fmt: str):
    """(dequantized float64 values, scale_inv) with the scale from v's amax."""
    amax = float(np.max(np.abs(v32))) if v32.size else 0.0
    scale = R.seed_scale(amax, fmt) if amax > 0 else F32(1)
    sinv = float(ref.reciprocal(scale))
    return ref.quantize_dequantize(v32, scale, fmt), sinv


def flip_bound(q: np.ndarray, sinv: float, fmt: str) -> np.ndarray:
    """Per element: one FP8 ulp of q (the neighbouring FP8 value)."""
    return ULP[fmt] * np.abs(q) + SUBNORMAL[fmt] * sinv


def gemm_bound(a_abs, b_abs, inner: int) -> np.ndarray:
    """float32 accumulation error of a GEMM with |A| @ |B| (inner terms)."""
    return ACC * inner * (a_abs @ b_abs)


class Reference:
    """One step of LayerNormLinear (act None) or LayerNormMLP."""

    def __init__(self, x, gamma, beta, layernorm, eps, w1, b1, w2=None, b2=None, act=None):
        self.ln, self.act = layernorm, act
        self.x, self.gamma = np.asarray(x, F32), np.asarray(gamma, F32)
        self.xn, self.mean, self.rsigma = R.norm_forward(self.x, gamma, beta, layernorm, eps)
        self.xq, self.x_sinv = quantize(self.xn, "e4m3")
        self.w1q, _ = quantize(np.asarray(w1, F32), "e4m3")
        b1 = 0.0 if b1 is None else np.asarray(b1, np.float64)
        h = self.xq @ self.w1q.T + b1
        self.h_bound = gemm_bound(np.abs(self.xq), np.abs(self.w1q).T, self.x.shape[1])
        if act is None:
            self.y, self.y_bound = h, self.h_bound
            return
        self.h = h.astype(F32)
        self.a32 = R.activation_forward(self.h, act)
        self.aq, self.a_sinv = quantize(self.a32, "e4m3")
        self.w2q, _ = quantize(np.asarray(w2, F32), "e4m3")
        b2 = 0.0 if b2 is None else np.asarray(b2, np.float64)
        self.y = self.aq @ self.w2q.T + b2
        w2_abs = np.abs(self.w2q).T
        self.y_bound = (flip_bound(self.aq, self.a_sinv, "e4m3") @ w2_abs
                        + gemm_bound(np.abs(self.aq), w2_abs, self.aq.shape[1]))

    def backward(self, dy):
        """Reference gradients and their bounds: dict name -> (value, bound)."""
        dy32 = np.asarray(dy, F32)
        dyq, dy_sinv = quantize(dy32, "e5m2")
        out = {}
        if self.act is None:
            d_in, d_in_bound = dyq @ self.w1q, gemm_bound(np.abs(dyq), np.abs(self.w1q),
                                                          dyq.shape[1])
            out["weight"] = (dyq.T @ self.xq,
                             gemm_bound(np.abs(dyq).T, np.abs(self.xq), dyq.shape[0]))
            out["bias"] = (ref.column_sums(dy32), 0.0)
        else:
            d_a = dyq @ self.w2q
            d_a_bound = gemm_bound(np.abs(dyq), np.abs(self.w2q), dyq.shape[1])
            out["fc2_weight"] = (dyq.T @ self.aq,
                                 dyq.T.__abs__() @ flip_bound(self.aq, self.a_sinv, "e4m3")
                                 + gemm_bound(np.abs(dyq).T, np.abs(self.aq), dyq.shape[0]))
            out["fc2_bias"] = (ref.column_sums(dy32), 0.0)
            dh32 = R.activation_backward(d_a.astype(F32), self.h, self.act)
            dhq, dh_sinv = quantize(dh32, "e5m2")
            # dh moves with d_a (and h) by their GEMMs' accumulation error, by
            # at most |act'| (bounded by 1.2 for GELU; SwiGLU's by |up|, |silu|):
            # the FP8 copy may then take the neighbouring value.
            dh_bound = flip_bound(dhq, dh_sinv, "e5m2")
            out["fc1_bias"] = (ref.column_sums(dh32), self._dh_sum_bound(d_a_bound, d_a))
            out["fc1_weight"] = (dhq.T @ self.xq, dh_bound.T @ np.abs(self.xq)
                                 + gemm_bound(np.abs(dhq).T, np.abs(self.xq), dhq.shape[0]))
            d_in = dhq @ self.w1q
            d_in_bound = (dh_bound @ np.abs(self.w1q)
                          + gemm_bound(np.abs(dhq), np.abs(self.w1q), dhq.shape[1]))
        d32 = d_in.astype(F32)
        dx, dgamma, dbeta = R.norm_backward(d32, self.x, self.mean, self.rsigma, self.gamma,
                                            self.ln)
        xhat = np.abs((self.x - (self.mean[:, None] if self.ln else 0)) * self.rsigma[:, None])
        b = d_in_bound + 2.0 ** -23 * np.abs(d_in)  # + the float32 rounding of d_in
        gb = np.abs(self.gamma)[None, :] * b
        h = self.x.shape[1]
        dx_bound = self.rsigma[:, None] * (gb + xhat * (xhat * gb).sum(1, keepdims=True) / h
                                           + (gb.sum(1, keepdims=True) / h if self.ln else 0))
        out["x"] = (dx, dx_bound)
        out["gamma"] = (dgamma, (b * xhat).sum(0))
        if self.ln:
            out["beta"] = (dbeta, b.sum(0))
        return out

    def _dh_sum_bound(self, d_a_bound, d_a):
        """dh's column sums move with d_a's and h's accumulation errors
        through act' and act'' (|gelu'| <= 1.2, |gelu''| <= 0.8; |silu'|
        <= 1.1, |silu''| <= 0.5), plus a few float32 ulp of dh itself."""
        d_a = np.abs(d_a)
        if self.act == "gelu":
            b = 1.2 * d_a_bound + 0.8 * d_a * self.h_bound
        else:
            f = d_a.shape[1]
            up = np.abs(self.h[:, f:]).astype(np.float64)
            hg, hu = self.h_bound[:, :f], self.h_bound[:, f:]
            silu = np.abs(R.silu32(self.h[:, :f])).astype(np.float64)
            b = np.concatenate([1.1 * (up * d_a_bound + d_a * hu) + 0.5 * d_a * up * hg,
                                silu * d_a_bound + 1.1 * d_a * hg], 1)
        dh = np.abs(R.activation_backward(d_a.astype(F32), self.h, self.act))
        return (b + 2.0 ** -19 * dh).sum(0)
