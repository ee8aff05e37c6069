"""The norm and the activation of fp8kit.jax.layernorm_dense and
layernorm_mlp under BlockScaling.

The core's fused norm and activation kernels cast their output with one
scale per tensor (common/include/fp8kit/fused_cast.h); a block-scaled cast
needs each 1x128 tile's amax first. So under BlockScaling the norm, the
activation and the activation's backward run here in float32 jnp, with the
formulas of common/include/fp8kit/normalization.h and activation.h (XLA
picks the order of the sums), and their outputs go through the block
quantization of the Linear that reads them (_linear.quantize_block), as
fp8kit.jax.dense's input does. The norm backward needs no cast: it stays
the core's (_fused_steps.norm_backward). Sharded, XLA partitions these
jnp ops and each block cast keeps whole tiles per device
(_sharding_block.py refuses a sharding that would split one).

Each cast operand is zero-padded to the block GEMM's token multiple
(_linear.py says why zero rows change no real tile's scale) before it is
quantized; the layers slice the GEMM outputs back to the real rows. The
padded float32 operand is returned beside its cast: the values that cast
read, whose statistics a layer records when asked (unused otherwise).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fp8kit.jax import _linear
from fp8kit.jax import _sharding as sh
from fp8kit.jax._mlp_fc1 import HALVES, Pair
from fp8kit.jax._linear import LinearCall
from fp8kit.jax.scaled_tensor import ScaledTensor

F32 = jnp.float32


def _quantize_tokens(lin: LinearCall, v, fmt: str, copies, what: str):
    """v [rows, cols] (float32) padded to the GEMM's token rows, cast 1x128:
    (ScaledTensor, the padded v)."""
    v = _linear.pad_token_rows(lin, v)
    return _linear.quantize_block(lin, v, fmt, copies, "block_1x128", what), v


def norm_forward(lin: LinearCall, norm: str, epsilon: float, x, gamma, beta, copies):
    """The norm of x [rows, hidden] in float32, cast as `lin`'s input:
    (ScaledTensor of the padded rows, mean (LayerNorm) or None, rsigma, the
    padded float32 norm), mean and rsigma float32 [rows] as the core's norm
    backward reads them.
    gamma and beta have x's dtype (as the core's kernel takes them)."""
    x = x.astype(F32)
    width, eps = F32(x.shape[1]), F32(epsilon)
    if norm == "layernorm":
        mean = jnp.sum(x, axis=1) / width
        centered = x - mean[:, None]
        rsigma = 1 / jnp.sqrt(jnp.sum(centered * centered, axis=1) / width + eps)
        y = centered * rsigma[:, None] * gamma.astype(F32) + beta.astype(F32)
    else:
        mean = None
        rsigma = 1 / jnp.sqrt(jnp.sum(x * x, axis=1) / width + eps)
        y = (x * rsigma[:, None]) * gamma.astype(F32)
    yq, y = _quantize_tokens(lin, y, lin.forward_dtype, copies, "the norm output")
    return yq, mean, rsigma, y


def _activation(activation: str):
    """act(h) on float32 h: GELU (tanh approximation) or SwiGLU on
    [gate | up] or on the paired [rows, 2, F] (gate h[:, 0], up h[:, 1])."""
    if activation == "gelu":
        return lambda h: jax.nn.gelu(h, approximate=True)

    def swiglu(h):
        gate, up = (h[:, 0], h[:, 1]) if h.ndim == 3 else jnp.split(h, 2, axis=1)
        return jax.nn.silu(gate) * up

    return swiglu


def activation_forward(lin: LinearCall, activation: str, h, copies):
    """act(h) (h [rows, F], [rows, 2F] or [rows, 2, F], the GEMMs' output) in
    float32, cast as `lin`'s input, its rows padded: (ScaledTensor, the
    padded float32 act(h))."""
    a = _activation(activation)(h.astype(F32))
    return _quantize_tokens(lin, a, lin.forward_dtype, copies, "the activation output")


def activation_backward(lin: LinearCall, activation: str, d_a, h, copies):
    """dh = d_a * act'(h) in float32 (the derivative of activation_forward's
    function), cast as `lin`'s output gradient, with `lin`'s bias gradient
    (its column sums, None without a bias): (dq, db, the padded float32
    dh). dq is a ScaledTensor, or for a paired h an _mlp_fc1.Pair of the
    halves, each cast with blocks of its own (as the halves of kernel_1
    are; dh is then None: no one cast read it)."""
    a, vjp = jax.vjp(_activation(activation), h.astype(F32))
    # Under Explicit mesh axes d_a, a GEMM's result, is typed replicated,
    # and a with h's layout (_mlp_fc1.forward_gemm types h): type d_a so.
    (dh,) = vjp(sh.retype(d_a, sh.explicit_spec(a)).astype(F32))
    db = None if lin.bias_dtype is None else jnp.sum(dh, axis=0).astype(lin.bias_dtype)
    if dh.ndim == 3:
        return Pair(None, tuple(_quantize_tokens(lin, dh[:, i], lin.backward_dtype, copies,
                                                 f"the activation gradient's {half} half")[0]
                                for i, half in enumerate(HALVES))), db, None
    dq, dh = _quantize_tokens(lin, dh, lin.backward_dtype, copies, "the activation gradient")
    return dq, db, dh
