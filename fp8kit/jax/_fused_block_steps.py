"""The norm and the activation of fp8kit.jax.layernorm_dense and
layernorm_mlp under BlockScaling.

The core's fused norm and activation kernels cast their output with one
scale per tensor (common/include/fp8kit/fused_cast.h); a block-scaled cast
needs each 1x128 tile's amax first. So under BlockScaling the norm, the
activation and the activation's backward run the core's kernels without
their cast (_sharding_fused_values.py), in the input's dtype, as
fp8kit.torch's block-scaled layers do, and their outputs go through the
block quantization of the Linear that reads them (_linear.quantize_block),
as fp8kit.jax.dense's input does. The norm backward needs no cast: it is
the core's as in the other recipes (_fused_steps.norm_backward). Each
block cast keeps whole tiles per device (_sharding_block.py refuses a
sharding that would split one).

Each cast operand is zero-padded to the block GEMM's token multiple
(_linear.py says why zero rows change no real tile's scale) before it is
quantized; the layers slice the GEMM outputs back to the real rows. The
padded operand is returned beside its cast: the values that cast read,
whose statistics a layer records when asked (unused otherwise).
"""

from __future__ import annotations

import jax.numpy as jnp

from fp8kit.jax import _linear
from fp8kit.jax import _sharding_fused_values as values
from fp8kit.jax._mlp_fc1 import HALVES, Pair
from fp8kit.jax._linear import LinearCall
from fp8kit.jax.scaled_tensor import ScaledTensor

F32 = jnp.float32


def _quantize_tokens(lin: LinearCall, v, fmt: str, copies, what: str):
    """v [rows, cols] padded to the GEMM's token rows, cast 1x128:
    (ScaledTensor, the padded v)."""
    v = _linear.pad_token_rows(lin, v)
    return _linear.quantize_block(lin, v, fmt, copies, "block_1x128", what), v


def norm_forward(lin: LinearCall, norm: str, epsilon: float, x, gamma, beta, copies):
    """The norm of x [rows, hidden] in x's dtype, cast as `lin`'s input:
    (ScaledTensor of the padded rows, mean (LayerNorm) or None, rsigma, the
    padded norm), mean and rsigma float32 [rows] as the core's norm
    backward reads them.
    gamma and beta have x's dtype (as the core's kernel takes them)."""
    y, mean, rsigma = values.norm_forward(x, gamma, beta, norm, epsilon)
    yq, y = _quantize_tokens(lin, y, lin.forward_dtype, copies, "the norm output")
    return yq, mean, rsigma, y


def activation_forward(lin: LinearCall, activation: str, h, copies):
    """act(h) (h [rows, F], [rows, 2F] or [rows, 2, F], the GEMMs' output) in
    h's dtype, cast as `lin`'s input, its rows padded: (ScaledTensor, the
    padded act(h))."""
    a = values.activation_forward(h, activation)
    return _quantize_tokens(lin, a, lin.forward_dtype, copies, "the activation output")


def activation_backward(lin: LinearCall, activation: str, d_a, h, copies):
    """dh = d_a * act'(h) in h's dtype, cast as `lin`'s output gradient,
    with `lin`'s bias gradient (dh's float32 column sums, as
    _linear.quantize_grad takes a block-scaled dy's; None without a bias):
    (dq, db, the padded dh). dq is a ScaledTensor, or for a paired h an
    _mlp_fc1.Pair of the halves, each cast with blocks of its own (as the
    halves of kernel_1 are; dh is then None: no one cast read it)."""
    dh = values.activation_backward(d_a, h, activation)
    db = (None if lin.bias_dtype is None
          else jnp.sum(dh.astype(F32), axis=0).astype(lin.bias_dtype))
    if dh.ndim == 3:
        return Pair(None, tuple(_quantize_tokens(lin, dh[:, i], lin.backward_dtype, copies,
                                                 f"the activation gradient's {half} half")[0]
                                for i, half in enumerate(HALVES))), db, None
    dq, dh = _quantize_tokens(lin, dh, lin.backward_dtype, copies, "the activation gradient")
    return dq, db, dh
