"""Sharding rule of block-scaled quantization (overview in _sharding.py),
and the shard sizes a block-scaled tensor allows, which the GEMM's rule
reads too.

A block is never split across devices. Each device quantizes its shard of
x's 2-D view [rows, cols] (the first and the last dim may be sharded, the
middle ones are replicated, as with a per-tensor columnwise copy), and its
data and scale arrays are then exactly slices of the unsharded call's when
every sharded dimension holds, per device, a whole number of blocks along
it and of the scale layout's padding unit (the scale arrays' inner
dimension is padded to 4 floats, common/include/fp8kit/block_scaling.h):

                      rows per shard      cols per shard
  1x128 rowwise       multiple of 4       multiple of 128
  1x128 columnwise    multiple of 128     multiple of 4
  128x128 rowwise     multiple of 128     multiple of 512 (4 blocks)
  128x128 columnwise  multiple of 512     multiple of 128

A sharding that breaks this is refused with a ValueError naming the mesh
axes, the dimension and the fix; it is never padded or gathered silently.
A dimension whose size is not a multiple of its mesh axes is replicated,
as in every fp8kit sharding rule.

The scale arrays' dims are factors of their own in the Shardy rule (their
sizes are not the data's), so propagation may type them replicated: XLA
then all-gathers the scales (1/32 of the FP8 data's bytes for 1x128, far
less for 128x128) and each GEMM slices its part back. The FP8 data and the
inputs are never gathered.
"""

from __future__ import annotations

import functools
import math

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec as P

from fp8kit.jax import _ffi
from fp8kit.jax import _sharding as sh
from fp8kit.jax import _sharding_quantize as shq


def shard_multiples(scaling_mode: str, rowwise: bool, columnwise: bool) -> tuple[int, int]:
    """(rows, cols) of the 2-D view that each shard must hold a multiple of
    (the table above); rows are the stored rowwise copy's."""
    # The scale layout pads each scale array's inner dimension to pad floats.
    block, pad = _ffi.BLOCK_LEN, _ffi.BLOCK_SCALE_INNER_MULTIPLE
    rows, cols = 1, 1
    if scaling_mode == "block_1x128":
        needs = [(pad, block)] * rowwise + [(block, pad)] * columnwise
    else:
        needs = [(block, pad * block)] * rowwise + [(pad * block, block)] * columnwise
    for r, c in needs:
        rows, cols = math.lcm(rows, r), math.lcm(cols, c)
    return rows, cols


def check_shards(fn: str, arg: str, scaling_mode: str, rowwise: bool, columnwise: bool, shape,
                 dims, mesh_shape) -> None:
    """ValueError unless each sharded dim of `shape` (dims: its mesh axes
    per dim; only the first and the last may be sharded) keeps whole blocks
    on each device."""
    if not shape:
        return
    rows_multiple, cols_multiple = shard_multiples(scaling_mode, rowwise, columnwise)
    # (dim, its length in the 2-D view, multiple, what): sharding the first
    # dim splits the view's rows, prod(shape[:-1]), into contiguous chunks.
    checks = [(len(shape) - 1, shape[-1], cols_multiple, "columns")]
    if len(shape) > 1:
        checks.append((0, math.prod(shape[:-1]), rows_multiple, "rows"))
    copies = " and ".join(c for c, held in (("rowwise", rowwise), ("columnwise", columnwise))
                          if held)
    for dim, length, multiple, what in checks:
        axes = dims[dim]
        if not axes:
            continue
        shards = math.prod(mesh_shape[a] for a in axes)
        per_shard = length // shards
        if per_shard % multiple:
            raise ValueError(
                f"{fn}: {arg} has shape {tuple(shape)} and its dim {dim} is sharded over mesh "
                f"axes {axes} into {shards} shards of {per_shard} {what}, but {scaling_mode} "
                f"quantization ({copies} copy) needs each device to hold a multiple of "
                f"{multiple} {what}, or a {_ffi.BLOCK_LEN}-element block (or the scale "
                f"layout's {_ffi.BLOCK_SCALE_INNER_MULTIPLE}-float padding) would be split across devices. Shard "
                f"dim {dim} over fewer devices, pad the {what} to a multiple of "
                f"{multiple * shards}, or leave dim {dim} replicated.")


def check_explicit_shards(fn: str, arg: str, x, scaling_mode: str, rowwise: bool,
                          columnwise: bool) -> None:
    """check_shards on x's sharding type while tracing, under Explicit mesh
    axes (with Auto axes XLA picks the sharding later and the partitioner
    checks it)."""
    spec = sh.explicit_spec(x)
    if spec is None:
        return
    dims = [sh.spec_axes(spec, i) for i in range(x.ndim)]
    mesh = jax.sharding.get_abstract_mesh()
    check_shards(fn, arg, scaling_mode, rowwise, columnwise, x.shape, dims,
                 dict(zip(mesh.axis_names, mesh.axis_sizes)))


def _dims(mesh, x):
    """Mesh axes per dim of x: the first and the last dim's (the middle
    dims would interleave the rows of the 2-D view, and so of the scales)."""
    return shq.x_dims(mesh, x, columnwise=True)


def scale_dims(scaling_mode: str, dims, columnwise: bool):
    """Mesh axes of the scale array [outer, inner] of one copy of a tensor
    with mesh axes `dims` per dim (of its 2-D view for the GEMM)."""
    rows = dims[0] if len(dims) > 1 else ()
    cols = dims[-1] if dims else ()
    # 1x128 rowwise and 128x128 columnwise: outer runs along the tensor's
    # columns, inner along its rows; the other two the other way round.
    if (scaling_mode == "block_1x128") != columnwise:
        return [cols, rows]
    return [rows, cols]


def _result_shardings(mesh, scaling_mode, rowwise, columnwise, dims):
    data, columnwise_data = shq.fp8_result_shardings(mesh, dims, rowwise, columnwise)
    rep1 = NamedSharding(mesh, P(None))
    scales = [sh.named(mesh, scale_dims(scaling_mode, dims, cw)) if wanted else rep1
              for cw, wanted in ((False, rowwise), (True, columnwise))]
    return data, columnwise_data, *scales


def _partition(fmt, rowwise, columnwise, scaling_mode, amax_epsilon, power_2_scale, mesh,
               arg_shapes, result_shape):
    x = arg_shapes[0]
    dims = _dims(mesh, x)
    check_shards("fp8kit.jax.quantize_block_scaling", "x", scaling_mode, rowwise, columnwise,
                 x.shape, dims, mesh.shape)

    @sh.per_shard
    def lower(x):
        return _ffi.quantize_block_scaling_call(x, fmt, rowwise, columnwise, scaling_mode,
                                                amax_epsilon, power_2_scale)

    return (mesh, lower, _result_shardings(mesh, scaling_mode, rowwise, columnwise, dims),
            (sh.named(mesh, dims),))


def _infer(fmt, rowwise, columnwise, scaling_mode, amax_epsilon, power_2_scale, mesh, arg_shapes,
           result_shape):
    dims = _dims(mesh, arg_shapes[0])
    return _result_shardings(mesh, scaling_mode, rowwise, columnwise, dims)


def _rule(fmt, rowwise, columnwise, scaling_mode, amax_epsilon, power_2_scale, mesh, ops, res):
    # The scale arrays' dims have sizes of their own: factors of their own.
    text = shq.quantize_rule_text(sh.rank_of(ops[0]), rowwise, columnwise, 0, False)
    scales = ["sr0 sr1" if rowwise else "psr", "sc0 sc1" if columnwise else "psc"]
    return f"{text}, {', '.join(scales)}"


@functools.partial(custom_partitioning, static_argnums=(1, 2, 3, 4, 5, 6))
def _quantize_block_p(x, fmt, rowwise, columnwise, scaling_mode, amax_epsilon, power_2_scale):
    return _ffi.quantize_block_scaling_call(x, fmt, rowwise, columnwise, scaling_mode,
                                            amax_epsilon, power_2_scale)


_quantize_block_p.def_partition(partition=_partition, infer_sharding_from_operands=_infer,
                                sharding_rule=_rule)


def quantize_block_scaling(x, fmt, rowwise, columnwise, scaling_mode, amax_epsilon,
                           power_2_scale):
    """(data, columnwise_data, block_scale_inv, columnwise_block_scale_inv);
    each device quantizes its own whole blocks when a mesh is in context."""
    args = (fmt, bool(rowwise), bool(columnwise), scaling_mode, float(amax_epsilon),
            bool(power_2_scale))
    if sh.use_partitioned(x):
        return _quantize_block_p(x, *args)
    return _ffi.quantize_block_scaling_call(x, *args)
