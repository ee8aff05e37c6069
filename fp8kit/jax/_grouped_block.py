"""grouped_dense under BlockScaling: the casts and GEMMs of the grouped
layer in the padded row layout of common/include/fp8kit/grouped.h.

A block-scaled GEMM reads its token dimension in multiples of 16, so
every expert's tokens are padded to p_e = m_e rounded up to
GEMM_DIM_MULTIPLE, each expert's rows at its padded offset P_e = p_0 + ...
+ p_{e-1} of a buffer of T + 15 E rows (the most the padding can take, so
the shapes are static), zero rows elsewhere. The offsets come from
group_sizes with jnp ops, so nothing is read on the host here. Each
expert is then cast and multiplied as fp8kit.jax.dense casts and
multiplies its tokens padded to 16 with zero rows (_linear.py): x and dy
1x128, the kernel 128x128, the same tiles, scales and GEMMs, so the
results agree with dense per expert bit for bit; the real rows are
gathered back.

Which copy each GEMM reads (block-scaled GEMMs take both operands
K-contiguous): the forward reads each kernel [K, N] as [N, K], the
kernels' columnwise copy: they are cast as one padded grouped tensor
[E * K, N] of E groups of K rows (K a multiple of 16: no padding), whose
columnwise copy is each expert's [N, K] transpose at element E * N * K
with its 128x128 scales, one matrix's after another. dgrad reads the
rowwise copy [E, K, N] (contracting N), wgrad the columnwise copies of x
and dy (contracting each expert's padded tokens).
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from fp8kit.jax import _ffi, _ffi_grouped
from fp8kit.jax import _grouped_statistics as gstats
from fp8kit.jax import _sharding_grouped as shg
from fp8kit.jax.delayed_scaling import GRAD_OUTPUT, INPUT, WEIGHT

_ROWS = "block_1x128"       # x and dy
_KERNEL = "block_128x128"   # the kernels


def padded_rows(group_sizes, tokens: int):
    """(rows, dest): the padded buffer's rows and each token's row in it,
    [T] int32."""
    e = group_sizes.shape[0]
    sizes = group_sizes.astype(jnp.int32)
    multiple = _ffi.GEMM_DIM_MULTIPLE
    padded = (sizes + multiple - 1) // multiple * multiple
    shift = jnp.cumsum(padded) - padded - (jnp.cumsum(sizes) - sizes)  # P_e - start_e
    experts = jnp.repeat(jnp.arange(e, dtype=jnp.int32), sizes, total_repeat_length=tokens)
    dest = jnp.arange(tokens, dtype=jnp.int32) + shift[experts]
    return _ffi_grouped.columnwise_tokens(tokens, e), dest


def _pad(t, dest, rows: int):
    return jnp.zeros((rows, t.shape[1]), t.dtype).at[dest].set(t, unique_indices=True)


def _gemm_dtype(dtype):
    """cuBLASLt's block-scaled GEMM writes bfloat16 or float32: a float16
    result is computed in float32 and rounded once, as dense does."""
    return jnp.dtype(jnp.float32) if jnp.dtype(dtype) == jnp.float16 else jnp.dtype(dtype)


def _matrix_scales(shape, columnwise: bool) -> int:
    """The floats of one [K, N] kernel's 128x128 scales."""
    return math.prod(_ffi.block_scale_inv_shape(_KERNEL, shape, columnwise))


def _cast(recipe, t, sizes, tokens: int, fmt: str, rowwise: bool, columnwise: bool, mode: str):
    """The cast of t, padded from `tokens` real rows (the sizes' sum, which
    the call checks; -1 for the kernels' own sizes)."""
    return shg.grouped_quantize_block(t, sizes, fmt, rowwise, columnwise, mode,
                                      recipe.amax_epsilon, recipe.power_2_scale, tokens)


def forward(cfg, x, kernels, bias, group_sizes, experts, grads: bool, stats=None):
    """(y [T, N] in x's dtype, what backward reads (None without grads),
    stats with the rows of x and the kernels set). experts: each token's
    expert [T] (for a float32 bias); stats: statistics rows or None (then
    the kernels' rowwise copy is made, which grads makes too)."""
    (t, k), (e, _, n) = x.shape, kernels.shape
    recipe, fmt = cfg.recipe, cfg.recipe.fp8_format.forward_dtype
    rows, dest = padded_rows(group_sizes, t)
    sizes = _ffi_grouped.sizes_operand(group_sizes)
    x_p = _pad(x, dest, rows)
    x_d, x_cw, x_s, x_cws = _cast(recipe, x_p, sizes, t, fmt, True, grads, _ROWS)
    stats = gstats.block_tokens(stats, INPUT, x_p, x_d, x_s, group_sizes, t * k)
    kernel_sizes = _ffi_grouped.sizes_operand(jnp.full((e,), k, jnp.int32))
    k_2d = kernels.reshape(e * k, n)
    k_d, k_cw, k_s, k_cws = _cast(recipe, k_2d, kernel_sizes, -1, fmt,
                                  grads or stats is not None, True, _KERNEL)
    stats = gstats.block_kernels(stats, WEIGHT, k_2d, k_d, k_s, e)
    out = _gemm_dtype(cfg.x_dtype)
    # The GEMM epilogue adds a bias of its output's 16-bit type; a float32
    # output gets its bias added outside, in float32, as dense does.
    fused = bias is not None and out != jnp.float32
    y = shg.grouped_gemm_block_tokens(
        x_d, x_s, _ROWS, k_cw.reshape(e, n, k), k_cws[:e * _matrix_scales((k, n), True)],
        _KERNEL, sizes, False, True, out, not recipe.forward_fast_accumulation,
        bias.astype(out) if fused else None)[dest]
    if bias is not None and not fused:
        y = y + bias.astype(out)[experts]
    saved = None
    if grads:
        saved = (x_cw, x_cws, k_d.reshape(e, k, n), k_s[:e * _matrix_scales((k, n), False)], dest)
    return y.astype(cfg.x_dtype), saved, stats


def backward(cfg, saved, group_sizes, dy, stats=None):
    """(dx, dk, stats with the output gradient's row set) from forward's
    saved copies."""
    x_cw, x_cws, k_d, k_s, dest = saved
    rows = x_cw.shape[1]
    sizes = _ffi_grouped.sizes_operand(group_sizes)
    dy_p = _pad(dy, dest, rows)
    dq_d, dq_cw, dq_s, dq_cws = _cast(cfg.recipe, dy_p, sizes, dy.shape[0],
                                      cfg.recipe.fp8_format.backward_dtype, True, True, _ROWS)
    stats = gstats.block_tokens(stats, GRAD_OUTPUT, dy_p, dq_d, dq_s, group_sizes,
                                math.prod(dy.shape))
    dx = shg.grouped_gemm_block_tokens(dq_d, dq_s, _ROWS, k_d, k_s, _KERNEL, sizes, True, False,
                                       _gemm_dtype(cfg.x_dtype), True)[dest]
    dk = shg.grouped_gemm_block_contract(x_cw, x_cws, _ROWS, dq_cw, dq_cws, _ROWS, sizes,
                                         _gemm_dtype(cfg.kernel_dtype), True)
    return dx.astype(cfg.x_dtype), dk.astype(cfg.kernel_dtype), stats
