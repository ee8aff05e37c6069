"""A float64 NumPy model of fp8kit.jax.layernorm_dense and layernorm_mlp
under BlockScaling, independent of fp8kit: the norm and the activation of
fused_layers_float64.py in float64, every GEMM operand block-quantized by
block_scaling_model.py from its float32 value and multiplied in float64.

The norm output, the activation, dy and dh are quantized 1x128, each GEMM
reading its own copy (rowwise tiles for the forward and the dgrad,
columnwise tiles, i.e. 128 tokens of one feature, for the wgrad); the
kernels 128x128 (both copies share the blocks, so one value each). What the
layer stores rounds to x's dtype where the layer's does (the norm output,
h, the activation and its gradient dh, the GEMMs' y, d_a, d_ln and the norm
backward's dx; dgamma and dbeta to gamma's); the
bias is added in x's dtype for bfloat16 (the GEMM epilogue's), else in
float32. `quantized=False` gives the same layer
without any quantization (the precision reference).
"""

import numpy as np

import block_scaling_model as block
import fused_layers_float64 as ref


class Quantizer:
    """The recipe's block casts as float64 values (identity when off)."""

    def __init__(self, recipe, quantized: bool = True):
        self.fwd = recipe.fp8_format.forward_dtype
        self.bwd = recipe.fp8_format.backward_dtype
        self.eps, self.p2 = recipe.amax_epsilon, recipe.power_2_scale
        self.quantized = quantized

    def _values(self, stored, mode, fmt):
        q, s = block.quantize_copy(np.asarray(stored, np.float32), mode, fmt, self.eps, self.p2)
        return block.dequantize_copy(q, s, mode, fmt)

    def tiles(self, v, fmt):
        """(rowwise, columnwise) values of v [tokens, features], 1x128."""
        if not self.quantized:
            v = np.asarray(v, np.float64)
            return v, v
        return (self._values(v, "block_1x128", fmt),
                self._values(np.asarray(v).T, "block_1x128", fmt).T)

    def kernel(self, k):
        """The values of kernel k, 128x128 blocks."""
        if not self.quantized:
            return np.asarray(k, np.float64)
        return self._values(k, "block_128x128", self.fwd)


def _norm_backward(d_ln, xhat, rs, gamma, kind, dtype, param_dtype):
    dx, dgamma, dbeta = ref.norm_backward(d_ln, xhat, rs, gamma, kind)
    return ref.rounded(dx, dtype), ref.rounded(dgamma, param_dtype), ref.rounded(dbeta,
                                                                                param_dtype)


def _bias(b, dtype):
    if b is None:
        return 0
    return ref.rounded(b, dtype) if np.dtype(dtype) == np.dtype("bfloat16") else b


def layernorm_dense(x, gamma, beta, k, bias, dy, kind, eps, q: Quantizer, dtype,
                    param_dtype):
    """y and the gradients (dx, dgamma, dbeta, dk, db); x 2-D, dtype x's
    (the layer's), param_dtype gamma's."""
    y_ln, xhat, rs = ref.norm(x, gamma, beta, kind, eps)
    ln_r, ln_c = q.tiles(ref.rounded(y_ln, dtype), q.fwd)
    k_q = q.kernel(k)
    y = ref.rounded(ln_r @ k_q + _bias(bias, dtype), dtype)
    dq_r, dq_c = q.tiles(dy, q.bwd)
    d_ln = ref.rounded(dq_r @ k_q.T, dtype)
    dx, dgamma, dbeta = _norm_backward(d_ln, xhat, rs, gamma, kind, dtype, param_dtype)
    return y, (dx, dgamma, dbeta, ln_c.T @ dq_c, dy.sum(0))


def layernorm_mlp(x, gamma, beta, k1, b1, k2, b2, dy, kind, act, eps, q: Quantizer, dtype,
                  param_dtype):
    """y and the gradients (dx, dgamma, dbeta, dk1, db1, dk2, db2); x 2-D,
    dtype x's (the layer's), param_dtype gamma's."""
    y_ln, xhat, rs = ref.norm(x, gamma, beta, kind, eps)
    ln_r, ln_c = q.tiles(ref.rounded(y_ln, dtype), q.fwd)
    k1_q, k2_q = q.kernel(k1), q.kernel(k2)
    h = ref.rounded(ln_r @ k1_q + _bias(b1, dtype), dtype)
    a_r, a_c = q.tiles(ref.rounded(ref.activation(h, act), dtype), q.fwd)
    y = ref.rounded(a_r @ k2_q + _bias(b2, dtype), dtype)
    dq_r, dq_c = q.tiles(dy, q.bwd)
    d_a = ref.rounded(dq_r @ k2_q.T, dtype)
    dh = ref.rounded(ref.activation_backward(d_a, h, act), dtype)
    dh_r, dh_c = q.tiles(dh, q.bwd)
    d_ln = ref.rounded(dh_r @ k1_q.T, dtype)
    dx, dgamma, dbeta = _norm_backward(d_ln, xhat, rs, gamma, kind, dtype, param_dtype)
    return y, (dx, dgamma, dbeta, ln_c.T @ dh_c, dh.sum(0), a_c.T @ dq_c, dy.sum(0))
