"""Sharding rule of the fp8kit GEMM (overview in _sharding.py).

Factors: m (rows of D), n (columns of D), k (the reduction). Each operand's
one buffer is [m,k]/[k,m] or [k,n]/[n,k] depending on its layout
(GemmLayout.a_is_km / b_is_kn). m and n shardings pass through to D; a
sharded k makes every device multiply its K-slice in float32, then psum,
then add the bias once and round to the output type.

Block-scaled operands (always read K-contiguous: A [m,k], B [n,k]) bring
their block scales, sharded with them: a factor is sharded only when every
device keeps whole blocks and whole units of the scale layout's padding
(_sharding_block.shard_multiples), else it is replicated.

Grouped K: per-tensor operands read K-contiguous may come as A [m, g, k]
and B [n, g, k], the reduction running over g and k (SwiGLU's paired gate
and up halves, fp8kit/jax/_mlp_fc1.py). k may be sharded, g is not: each
device multiplies the [m, g * k_local] and [n, g * k_local] views of its
buffers, whose columns pair up as the unsharded [m, g * k] and [n, g * k]
do, and the partial products are summed as for a sharded K.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning

from fp8kit.jax import _ffi
from fp8kit.jax import _sharding as sh
from fp8kit.jax import _sharding_block as shb
from fp8kit.jax._ffi import GemmLayout


def _grouped(a_shape) -> bool:
    """Are the operands A [m, g, k] and B [n, g, k] (grouped K)?"""
    return len(a_shape) == 3


def _dims(layout: GemmLayout, grouped: bool = False):
    """(index of m, index of k) in a's buffer; (index of k, index of n) in
    b's. Grouped: k is the last dim (g, the one before it, is not split)."""
    if grouped:
        return 0, 2, 2, 0
    a_m, a_k = (1, 0) if layout.a_is_km else (0, 1)
    b_k, b_n = (0, 1) if layout.b_is_kn else (1, 0)
    return a_m, a_k, b_k, b_n


def _call(layout: GemmLayout, a_buf, a_scale_inv, b_buf, b_scale_inv, *bias):
    """gemm_call on one device's buffers, grouped ones as their 2-D views
    [m, g * k] and [n, g * k]."""
    if _grouped(a_buf.shape):
        a_buf, b_buf = sh.rows_view(a_buf), sh.rows_view(b_buf)
    return _ffi.gemm_call(layout, a_buf, a_scale_inv, b_buf, b_scale_inv, *bias)


def _multiples(layout: GemmLayout) -> tuple[int, int, int]:
    """What each shard of m, k and n must hold a multiple of: the FP8 GEMM
    alignment (K, and 16-byte output rows) and, block-scaled, whole blocks
    of both operands (whose buffers are [m,k] and [n,k]) and the block
    GEMM's multiples of 8."""
    m, k, n = 1, _ffi.GEMM_DIM_MULTIPLE, 16 // jnp.dtype(layout.out_dtype).itemsize
    if layout.block_scaled:
        m_a, k_a = shb.shard_multiples(layout.a_scaling_mode, True, False)
        n_b, k_b = shb.shard_multiples(layout.b_scaling_mode, True, False)
        m, n = math.lcm(m, m_a, 8), math.lcm(n, n_b, 8)
        k = math.lcm(k, k_a, k_b)
    return m, k, n


def _plan(layout: GemmLayout, mesh, arg_shapes):
    """Mesh axes for m, k, n: disjoint, even, alignment-preserving."""
    a, b = arg_shapes[0], arg_shapes[2]
    sa, sb = sh.spec(a), sh.spec(b)
    a_m, a_k, b_k, b_n = _dims(layout, _grouped(a.shape))
    m_size, k_size, n_size = a.shape[a_m], a.shape[a_k], b.shape[b_n]
    m_align, k_align, n_align = _multiples(layout)
    m_axes = sh.even(mesh, m_size, sa[a_m], m_align)
    k_axes = sh.even(mesh, k_size, sa[a_k], k_align) or sh.even(mesh, k_size, sb[b_k], k_align)
    if set(k_axes) & set(m_axes):
        k_axes = ()
    n_axes = sh.even(mesh, n_size, sb[b_n], n_align)
    if set(n_axes) & (set(m_axes) | set(k_axes)):
        n_axes = ()
    return m_axes, k_axes, n_axes


def _arg_shardings(layout, mesh, m_axes, k_axes, n_axes, has_bias, rank):
    a_m, a_k, b_k, b_n = _dims(layout, rank == 3)
    a_dims, b_dims = [()] * rank, [()] * rank
    a_dims[a_m], a_dims[a_k] = m_axes, k_axes
    b_dims[b_k], b_dims[b_n] = k_axes, n_axes
    rep = sh.replicated(mesh)
    a_scales, b_scales = rep, rep
    if layout.block_scaled:  # scale arrays laid out as their buffers' blocks
        a_scales = sh.named(mesh, shb.scale_dims(layout.a_scaling_mode, [m_axes, k_axes], False))
        b_scales = sh.named(mesh, shb.scale_dims(layout.b_scaling_mode, [n_axes, k_axes], False))
    shardings = [sh.named(mesh, a_dims), a_scales, sh.named(mesh, b_dims), b_scales]
    if has_bias:
        shardings.append(sh.named(mesh, [n_axes]))
    return tuple(shardings)


def _partition(layout: GemmLayout, mesh, arg_shapes, result_shape):
    m_axes, k_axes, n_axes = _plan(layout, mesh, arg_shapes)

    @sh.per_shard
    def lower(a, a_scale_inv, b, b_scale_inv, *bias):
        if not k_axes:
            return _call(layout, a, a_scale_inv, b, b_scale_inv, *bias)
        partial = dataclasses.replace(layout, out_dtype=jnp.dtype(jnp.float32), has_bias=False)
        d = jax.lax.psum(_call(partial, a, a_scale_inv, b, b_scale_inv), k_axes)
        if bias:
            d = d + bias[0].astype(jnp.float32)
        return d.astype(layout.out_dtype)

    return (mesh, lower, sh.named(mesh, [m_axes, n_axes]),
            _arg_shardings(layout, mesh, m_axes, k_axes, n_axes, layout.has_bias,
                           len(arg_shapes[0].shape)))


def _infer(layout: GemmLayout, mesh, arg_shapes, result_shape):
    m_axes, _, n_axes = _plan(layout, mesh, arg_shapes)
    return sh.named(mesh, [m_axes, n_axes])


def _rule(layout: GemmLayout, mesh, operand_types, result_types):
    if _grouped(operand_types[0].shape):
        a, b, reduced = "m g k", "n g k", ("g", "k")
    else:
        a = "k m" if layout.a_is_km else "m k"
        b = "k n" if layout.b_is_kn else "n k"
        reduced = ("k",)
    scales = ("sa0 sa1", "sb0 sb1") if layout.block_scaled else ("", "")
    operands = [a, scales[0], b, scales[1]] + (["n"] if layout.has_bias else [])
    return f"{', '.join(operands)} -> m n", {"reduction_factors": reduced}


@functools.partial(custom_partitioning, static_argnums=(0,))
def _gemm_p(layout, a, a_scale_inv, b, b_scale_inv):
    return _call(layout, a, a_scale_inv, b, b_scale_inv)


@functools.partial(custom_partitioning, static_argnums=(0,))
def _gemm_bias_p(layout, a, a_scale_inv, b, b_scale_inv, bias):
    return _call(layout, a, a_scale_inv, b, b_scale_inv, bias)


for _f in (_gemm_p, _gemm_bias_p):
    _f.def_partition(partition=_partition, infer_sharding_from_operands=_infer,
                     sharding_rule=_rule)


def gemm(layout: GemmLayout, a_buf, a_scale_inv, b_buf, b_scale_inv, bias=None):
    """D for one GEMM; partitioned when a mesh is in context. Per-tensor
    scales are scalars; block scales are passed as they are. 3-D buffers
    are grouped K (module docstring): per-tensor, A [m, g, k] and
    B [n, g, k]."""
    if _grouped(a_buf.shape) and (layout.block_scaled or layout.a_is_km or layout.b_is_kn
                                  or b_buf.ndim != 3 or a_buf.shape[1:] != b_buf.shape[1:]):
        raise ValueError("a grouped-K GEMM takes per-tensor A [m, g, k] and B [n, g, k] read "
                         f"K-contiguous; got A {a_buf.shape} and B {b_buf.shape}")
    if not layout.block_scaled:
        a_scale_inv = jnp.reshape(a_scale_inv, ())
        b_scale_inv = jnp.reshape(b_scale_inv, ())
    args = (a_buf, a_scale_inv, b_buf, b_scale_inv) + (() if bias is None else (bias,))
    if not sh.use_partitioned(*args):
        return _call(layout, *args)
    if bias is None:
        return _gemm_p(layout, *args)
    return _gemm_bias_p(layout, *args)
