"""Sharding rules for fp8kit's custom calls (jax.experimental.custom_partitioning).

Without these, XLA's partitioner would gather every operand of a custom call
onto every device. With them:

  amax, quantize   run on each shard; the amax is reduced with pmax over the
                   mesh axes the tensor is sharded on, so every device sees
                   the global amax (and current scaling computes one global
                   scale: amax -> pmax -> compute_scale -> cast).
  gemm             D[M,N] = A @ B with M, K and N sharded as the operands are:
                   M (data parallel) and N (kernel sharded along N) pass
                   through; a sharded K (kernel sharded along K) gives a
                   local float32 partial product summed with psum, the bias
                   added once after the sum.

A dimension whose size is not a multiple of its mesh axes, or whose shard
would break cuBLASLt's FP8 alignment (K and output rows), is replicated
instead. Shardy (jax's default partitioner) reads the einsum-like sharding
rules below for propagation; the partition callbacks decide the final
layouts.

These rules need the mesh axis names, so they are used when a mesh with
more than one device is in context (`with jax.set_mesh(mesh):` or
`with mesh:`); without one, the plain custom calls run (unsharded inputs,
or XLA gathers sharded ones). Under jax.vmap the plain calls run too
(custom_partitioning has no batching rule).
"""

from __future__ import annotations

import functools
import math

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec as P

from fp8kit.jax import amax_op as amax_lib
from fp8kit.jax import quantization as q


# --- helpers ---------------------------------------------------------------------

def mesh_in_context() -> bool:
    """True when a mesh of more than one device is in context."""
    try:
        am = jax.sharding.get_abstract_mesh()
        if not am.empty and math.prod(am.axis_sizes) > 1:
            return True
    except Exception:  # pragma: no cover - API differences across versions
        pass
    try:
        from jax._src import mesh as mesh_lib  # the legacy `with mesh:` context
        pm = mesh_lib.thread_resources.env.physical_mesh
        return (not pm.empty) and pm.size > 1
    except Exception:  # pragma: no cover
        return False


def _is_batched(*xs) -> bool:
    """Is any argument a vmap tracer (custom_partitioning cannot batch)?"""
    try:
        from jax._src.interpreters import batching  # no public name for the tracer type
    except ImportError:  # pragma: no cover
        return False
    return any(isinstance(x, batching.BatchTracer) for x in jax.tree_util.tree_leaves(xs))


def use_partitioned(*xs) -> bool:
    return mesh_in_context() and not _is_batched(*xs)


def _axes(entry) -> tuple[str, ...]:
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def _spec(shape_struct) -> list[tuple[str, ...]]:
    """Per-dimension mesh axes of an argument's sharding (() = replicated)."""
    sharding = shape_struct.sharding
    ndim = len(shape_struct.shape)
    spec = getattr(sharding, "spec", None)
    if spec is None:  # no mesh to name axes with: replicate
        return [()] * ndim
    spec = list(spec) + [None] * (ndim - len(spec))
    return [_axes(e) for e in spec[:ndim]]


def _size(mesh, axes) -> int:
    return math.prod(mesh.shape[a] for a in axes)


def _even(mesh, dim: int, axes, multiple: int = 1) -> tuple[str, ...]:
    """`axes` if they split `dim` into equal shards that are multiples of
    `multiple`, else () (replicate that dimension)."""
    if not axes:
        return ()
    n = _size(mesh, axes)
    return tuple(axes) if dim % n == 0 and (dim // n) % multiple == 0 else ()


def _pspec(dims) -> P:
    return P(*[(d if len(d) > 1 else d[0]) if d else None for d in dims])


def _named(mesh, dims) -> NamedSharding:
    return NamedSharding(mesh, _pspec(dims))


def _replicated(mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def _flat_axes(dims) -> tuple[str, ...]:
    return tuple(a for d in dims for a in d)


def _factors(rank: int, prefix: str = "d") -> list[str]:
    return [f"{prefix}{i}" for i in range(rank)]


def _rank_of(ir_type) -> int:
    return len(ir_type.shape)


# --- amax ---------------------------------------------------------------------------

def _amax_rule(mesh, operand_types, result_types):
    f = _factors(_rank_of(operand_types[0]))
    return f"{' '.join(f)} -> ", {"reduction_factors": tuple(f)}


def _amax_partition(mesh, arg_shapes, result_shape):
    x = arg_shapes[0]
    dims = [_even(mesh, d, a) for d, a in zip(x.shape, _spec(x))]
    axes = _flat_axes(dims)

    def lower(x):
        a = amax_lib.amax_call(x)
        return jax.lax.pmax(a, axes) if axes else a

    return mesh, lower, _replicated(mesh), (_named(mesh, dims),)


@custom_partitioning
def _amax_p(x):
    return amax_lib.amax_call(x)


_amax_p.def_partition(partition=_amax_partition, sharding_rule=_amax_rule,
                      infer_sharding_from_operands=lambda mesh, args, res: _replicated(mesh))


def amax(x):
    return _amax_p(x) if use_partitioned(x) else amax_lib.amax_call(x)


# --- quantize (given scale) and current-scaling quantize --------------------------------

def _quantize_rule_text(rank: int, rowwise: bool, columnwise: bool, n_scalars_out: int,
                        scale_arg: bool):
    f = _factors(rank)
    x = " ".join(f)
    data = x if rowwise else "pr"
    col = " ".join(f[-1:] + f[:-1]) if columnwise else "pc"
    args = f"{x}, " if scale_arg else f"{x}"
    results = ", ".join([data, col] + [""] * n_scalars_out)
    return f"{args} -> {results}"


def _x_dims(mesh, x):
    return [_even(mesh, d, a) for d, a in zip(x.shape, _spec(x))]


def _fp8_result_shardings(mesh, dims, rowwise, columnwise):
    rep1 = NamedSharding(mesh, P(None))
    data = _named(mesh, dims) if rowwise else rep1
    col = _named(mesh, dims[-1:] + dims[:-1]) if columnwise else rep1
    return data, col


def _quantize_partition(fmt, rowwise, columnwise, mesh, arg_shapes, result_shape):
    x = arg_shapes[0]
    dims = _x_dims(mesh, x)
    axes = _flat_axes(dims)

    def lower(x, scale):
        data, col, scale_inv, amax = q.quantize_call(x, scale, fmt, rowwise, columnwise)
        if axes:
            amax = jax.lax.pmax(amax, axes)
        return data, col, scale_inv, amax

    data, col = _fp8_result_shardings(mesh, dims, rowwise, columnwise)
    rep = _replicated(mesh)
    return mesh, lower, (data, col, rep, rep), (_named(mesh, dims), rep)


def _quantize_infer(fmt, rowwise, columnwise, mesh, arg_shapes, result_shape):
    dims = _x_dims(mesh, arg_shapes[0])
    data, col = _fp8_result_shardings(mesh, dims, rowwise, columnwise)
    rep = _replicated(mesh)
    return data, col, rep, rep


@functools.partial(custom_partitioning, static_argnums=(2, 3, 4))
def _quantize_p(x, scale, fmt, rowwise, columnwise):
    return q.quantize_call(x, scale, fmt, rowwise, columnwise)


_quantize_p.def_partition(
    partition=_quantize_partition, infer_sharding_from_operands=_quantize_infer,
    sharding_rule=lambda fmt, rowwise, columnwise, mesh, ops, res: _quantize_rule_text(
        _rank_of(ops[0]), rowwise, columnwise, 2, True))


def quantize(x, scale, fmt, rowwise, columnwise):
    """(data, columnwise, scale_inv, amax), sharded when a mesh is in context."""
    if use_partitioned(x, scale):
        return _quantize_p(x, scale, fmt, rowwise, columnwise)
    return q.quantize_call(x, scale, fmt, rowwise, columnwise)


def _current_partition(fmt, rowwise, columnwise, eps, pow2, mesh, arg_shapes, result_shape):
    x = arg_shapes[0]
    dims = _x_dims(mesh, x)
    axes = _flat_axes(dims)

    def lower(x):
        if not axes:  # every device holds the whole tensor: the fused kernel
            return q.quantize_current_scaling_call(x, fmt, rowwise, columnwise, eps, pow2)
        # The global amax first, then one scale for all shards, then the cast.
        amax = jax.lax.pmax(amax_lib.amax_call(x), axes)
        scale, scale_inv = q.compute_scale_call(amax, fmt, eps, pow2)
        data, col, _, _ = q.quantize_call(x, scale, fmt, rowwise, columnwise)
        return data, col, scale, scale_inv, amax

    data, col = _fp8_result_shardings(mesh, dims, rowwise, columnwise)
    rep = _replicated(mesh)
    return mesh, lower, (data, col, rep, rep, rep), (_named(mesh, dims),)


def _current_infer(fmt, rowwise, columnwise, eps, pow2, mesh, arg_shapes, result_shape):
    dims = _x_dims(mesh, arg_shapes[0])
    data, col = _fp8_result_shardings(mesh, dims, rowwise, columnwise)
    rep = _replicated(mesh)
    return data, col, rep, rep, rep


@functools.partial(custom_partitioning, static_argnums=(1, 2, 3, 4, 5))
def _quantize_current_p(x, fmt, rowwise, columnwise, eps, pow2):
    return q.quantize_current_scaling_call(x, fmt, rowwise, columnwise, eps, pow2)


_quantize_current_p.def_partition(
    partition=_current_partition, infer_sharding_from_operands=_current_infer,
    sharding_rule=lambda fmt, rowwise, columnwise, eps, pow2, mesh, ops, res:
        _quantize_rule_text(_rank_of(ops[0]), rowwise, columnwise, 3, False))


def quantize_current_scaling(x, fmt, rowwise, columnwise, eps, pow2):
    """(data, columnwise, scale, scale_inv, amax) with one global scale."""
    if use_partitioned(x):
        return _quantize_current_p(x, fmt, rowwise, columnwise, float(eps), bool(pow2))
    return q.quantize_current_scaling_call(x, fmt, rowwise, columnwise, eps, pow2)
