"""What the sharding rules share: is a mesh in context, and the mesh-axis
bookkeeping of custom_partitioning callbacks.

fp8kit's custom calls are partitioned (jax.experimental.custom_partitioning)
instead of gathered when a mesh of more than one device is in context
(`with jax.set_mesh(mesh):` or `with mesh:`); the rules themselves are in
_sharding_quantize.py, _sharding_block.py, _sharding_gemm.py,
_sharding_fused.py and _sharding_grouped.py:

  amax, quantize   run on each shard; the amax is reduced with pmax over the
                   mesh axes the tensor is sharded on, so every device sees
                   the global amax (and a scale computed from it is global).
  quantize_delayed_update (the dense layer's fused cast, seed and record)
                   starts the core's amax accumulator at each input's global
                   amax, so the state never moves on a shard's amax and every
                   device computes the unsharded call's state bit for bit.
                   Column sums (the bias gradient) of inputs whose rows are
                   sharded are summed across the shards in float32 (psum),
                   then rounded: exact when the rows are not sharded, within
                   float32 rounding of the unsharded sums when they are.
  quantize_block_scaling (_sharding_block.py)
                   each device quantizes whole blocks; a layout that would
                   split a block across devices is refused, naming the axis.
  gemm             D[M,N] = A @ B with M, K and N sharded as the operands are:
                   M (data parallel) and N (kernel sharded along N) pass
                   through; a sharded K gives a local float32 partial
                   product summed with psum, the bias added once after it.
                   K may be grouped (A [M,g,K], B [N,g,K], summed over g
                   and K: SwiGLU's paired halves), K sharded, g not.
  fused norm and activation (_sharding_fused.py)
                   the norm runs on each shard of the tokens; the
                   activation on each shard of the tokens and of its
                   features (tensor parallel: fc1's kernel sharded along
                   its outputs), SwiGLU's halves paired so that a device
                   holds matching gate and up columns; each cast starts at
                   the global amax, as quantize_delayed_update does.
  grouped ops (_sharding_grouped.py, grouped_dense's casts and GEMMs)
                   gathered: every device runs the whole call, since a
                   group of tokens may straddle the shards of a batch.

A dimension whose size is not a multiple of its mesh axes, or whose shard
would break cuBLASLt's FP8 alignment, is replicated instead. Shardy (jax's
default partitioner) reads each primitive's einsum-like sharding rule for
propagation; the partition callbacks decide the final layouts. Without a
mesh, or under jax.vmap (custom_partitioning has no batching rule), the
plain custom calls run.

Explicit mesh axes (jax.make_mesh's default, AxisType.Explicit) put the
sharding in each array's type, and JAX checks those types, e.g. a
custom_vjp's cotangents against its primals. A custom call's results are
typed replicated whatever the partition callback laid out, so the public
functions give their results the type the caller expects (`retype`: free
when the layout is already that one).
"""

from __future__ import annotations

import functools
import math

import jax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P


def mesh_in_context() -> bool:
    """True when a mesh of more than one device is in context."""
    try:
        am = jax.sharding.get_abstract_mesh()
        if not am.empty and math.prod(am.axis_sizes) > 1:
            return True
    except Exception:  # pragma: no cover - API differences across versions
        pass
    try:
        from jax._src import mesh as mesh_lib  # noqa: PLC0415  (private: the legacy `with mesh:`)
        pm = mesh_lib.thread_resources.env.physical_mesh
        return (not pm.empty) and pm.size > 1
    except Exception:  # pragma: no cover
        return False


def is_batched(*xs) -> bool:
    """Is any argument a vmap tracer (custom_partitioning cannot batch)?"""
    try:
        from jax._src.interpreters import batching  # noqa: PLC0415  (no public tracer type)
    except ImportError:  # pragma: no cover
        return False
    return any(isinstance(x, batching.BatchTracer) for x in jax.tree_util.tree_leaves(xs))


def use_partitioned(*xs) -> bool:
    """Run the partitioned primitive (a mesh in context, no vmap)?"""
    return mesh_in_context() and not is_batched(*xs)


def explicit_spec(x):
    """The PartitionSpec of x's sharding type when the mesh in context has
    Explicit axes (then the spec names only those), else None."""
    am = jax.sharding.get_abstract_mesh()
    if am.empty or not am.explicit_axes:
        return None
    return jax.typeof(x).sharding.spec


def retype(x, spec):
    """x with the sharding type `spec` (an explicit_spec); x itself when
    spec is None (no Explicit axes in context)."""
    if spec is None:
        return x
    return jax.sharding.reshard(x, spec)


def varying_axes(x) -> frozenset:
    """The manual mesh axes (inside jax.shard_map) x varies over; empty
    outside shard_map or for None."""
    if x is None:
        return frozenset()
    aval = jax.typeof(x)
    manual = getattr(aval, "manual_axis_type", None)
    return frozenset(manual.varying if manual is not None else getattr(aval, "vma", ()))


def vary_like(ct, axes: frozenset):
    """The cotangent ct typed varying over `axes`, its primal's varying axes:
    inside shard_map a custom_vjp's cotangents must carry their primals'
    types, and a result computed from replicated operands (a zero gradient,
    a custom call's output) is typed replicated."""
    missing = tuple(sorted(axes - varying_axes(ct))) if ct is not None else ()
    return jax.lax.pcast(ct, missing, to="varying") if missing else ct


def per_shard(lower):
    """Decorates a partition callback's per-shard function: it is traced
    with the mesh's axes typed Auto. JAX traces it under the caller's mesh;
    with Explicit axes it would type the scalars of each collective's
    reduction (pmax, psum) with that mesh and annotate them with a sharding
    inside the all-reduce's reducer, which XLA's GPU backend cannot lower
    (it aborts compiling, failing to recognise the reduction). The shards
    are already laid out by then, so the types carry nothing."""
    @functools.wraps(lower)
    def traced_with_auto_axes(*args):
        am = jax.sharding.get_abstract_mesh()
        if am.empty or not am.explicit_axes:
            return lower(*args)
        auto = am.update_axis_types({a: AxisType.Auto for a in am.axis_names})
        with jax.sharding.use_abstract_mesh(auto):
            return lower(*args)
    return traced_with_auto_axes


def rows_view(t):
    """t [d0, d1, ...] as [d0, d1 * ...]. Traced with global shapes under
    Explicit mesh axes (a custom call's unpartitioned body), the view is
    typed with d0's axes and replicated columns: a split minor dim cannot
    be typed merged with the dims before it. On one device's shard it is
    the plain view."""
    spec = explicit_spec(t)
    typed = None if spec is None else spec_of([spec_axes(spec, 0), ()])
    return jax.lax.reshape(t, (t.shape[0], math.prod(t.shape[1:])), out_sharding=typed)


def spec_axes(spec, dim: int) -> tuple[str, ...]:
    """The mesh axes dimension `dim` of a PartitionSpec is sharded on."""
    return _axes(spec[dim]) if dim < len(spec) else ()


def spec_of(dims) -> P:
    """The PartitionSpec of per-dimension mesh axes (() = replicated)."""
    return P(*[(d if len(d) > 1 else d[0]) if d else None for d in dims])


def _axes(entry) -> tuple[str, ...]:
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def spec(shape_struct) -> list[tuple[str, ...]]:
    """Per-dimension mesh axes of an argument's sharding (() = replicated)."""
    ndim = len(shape_struct.shape)
    entries = getattr(shape_struct.sharding, "spec", None)
    if entries is None:  # no mesh to name axes with: replicate
        return [()] * ndim
    entries = list(entries) + [None] * (ndim - len(entries))
    return [_axes(e) for e in entries[:ndim]]


def even(mesh, dim: int, axes, multiple: int = 1) -> tuple[str, ...]:
    """`axes` if they split `dim` into equal shards that are multiples of
    `multiple`, else () (replicate that dimension)."""
    if not axes:
        return ()
    n = math.prod(mesh.shape[a] for a in axes)
    return tuple(axes) if dim % n == 0 and (dim // n) % multiple == 0 else ()


def named(mesh, dims) -> NamedSharding:
    """The NamedSharding of per-dimension mesh axes."""
    return NamedSharding(mesh, spec_of(dims))


def replicated(mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def flat_axes(dims) -> tuple[str, ...]:
    """Every mesh axis some dimension is sharded on."""
    return tuple(a for d in dims for a in d)


def factors(rank: int, prefix: str = "d") -> list[str]:
    """Sharding-rule factor names for `rank` dimensions."""
    return [f"{prefix}{i}" for i in range(rank)]


def rank_of(ir_type) -> int:
    return len(ir_type.shape)
