"""Sharding rules of the amax and quantize custom calls (overview in
_sharding.py). Each function here runs the partitioned primitive when a
mesh is in context and the plain custom call otherwise."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec as P

from fp8kit.jax import _ffi
from fp8kit.jax import _sharding as sh


# --- amax ---------------------------------------------------------------------------

def _amax_rule(mesh, operand_types, result_types):
    f = sh.factors(sh.rank_of(operand_types[0]))
    return f"{' '.join(f)} -> ", {"reduction_factors": tuple(f)}


def _amax_partition(mesh, arg_shapes, result_shape):
    x = arg_shapes[0]
    dims = [sh.even(mesh, d, a) for d, a in zip(x.shape, sh.spec(x))]
    axes = sh.flat_axes(dims)

    @sh.per_shard
    def lower(x):
        a = _ffi.amax_call(x)
        return jax.lax.pmax(a, axes) if axes else a

    return mesh, lower, sh.replicated(mesh), (sh.named(mesh, dims),)


@custom_partitioning
def _amax_p(x):
    return _ffi.amax_call(x)


_amax_p.def_partition(partition=_amax_partition, sharding_rule=_amax_rule,
                      infer_sharding_from_operands=lambda mesh, args, res: sh.replicated(mesh))


def amax(x):
    """max |x|, the global one when x is sharded."""
    return _amax_p(x) if sh.use_partitioned(x) else _ffi.amax_call(x)


# --- quantize (given scale) and current-scaling quantize --------------------------------

def _columnwise_factors(f: list[str], tag: str = "") -> str:
    """Sharding-rule dims of the columnwise copy [last, prod(leading)] of a
    tensor with factors f ("one"/"lead" + tag name dims of size 1)."""
    if not f:
        return f"one{tag} lead{tag}"
    if len(f) == 1:
        return f"{f[0]} lead{tag}"
    leading = f[0] if len(f) == 2 else f"({' '.join(f[:-1])})"
    return f"{f[-1]} {leading}"


def quantize_rule_text(rank: int, rowwise: bool, columnwise: bool, n_scalars_out: int,
                        scale_arg: bool):
    f = sh.factors(rank)
    x = " ".join(f)
    data = x if rowwise else "pr"
    columnwise_data = _columnwise_factors(f) if columnwise else "pc"
    args = f"{x}, " if scale_arg else f"{x}"
    results = ", ".join([data, columnwise_data] + [""] * n_scalars_out)
    return f"{args} -> {results}"


def x_dims(mesh, x, columnwise: bool):
    """Mesh axes per dim of x. With a columnwise copy only the first and the
    last dim stay sharded: the copy's prod(leading) dim is then split in
    the blocks of the first dim (a sharded middle dim would interleave)."""
    dims = [sh.even(mesh, d, a) for d, a in zip(x.shape, sh.spec(x))]
    if columnwise:
        dims = [d if i in (0, len(dims) - 1) else () for i, d in enumerate(dims)]
    return dims


def _columnwise_dims(dims):
    """Mesh axes of the columnwise copy [last, prod(leading)] (see x_dims)."""
    if not dims:
        return [(), ()]
    return [dims[-1], dims[0] if len(dims) > 1 else ()]


def fp8_result_shardings(mesh, dims, rowwise, columnwise):
    rep1 = NamedSharding(mesh, P(None))
    data = sh.named(mesh, dims) if rowwise else rep1
    columnwise_data = sh.named(mesh, _columnwise_dims(dims)) if columnwise else rep1
    return data, columnwise_data


def _quantize_partition(fmt, rowwise, columnwise, mesh, arg_shapes, result_shape):
    x = arg_shapes[0]
    dims = x_dims(mesh, x, columnwise)
    axes = sh.flat_axes(dims)

    @sh.per_shard
    def lower(x, scale):
        data, columnwise_data, scale_inv, amax = _ffi.quantize_call(x, scale, fmt, rowwise,
                                                                    columnwise)
        if axes:
            amax = jax.lax.pmax(amax, axes)
        return data, columnwise_data, scale_inv, amax

    data_sharding, columnwise_sharding = fp8_result_shardings(mesh, dims, rowwise, columnwise)
    rep = sh.replicated(mesh)
    return (mesh, lower, (data_sharding, columnwise_sharding, rep, rep),
            (sh.named(mesh, dims), rep))


def _quantize_infer(fmt, rowwise, columnwise, mesh, arg_shapes, result_shape):
    dims = x_dims(mesh, arg_shapes[0], columnwise)
    data_sharding, columnwise_sharding = fp8_result_shardings(mesh, dims, rowwise, columnwise)
    rep = sh.replicated(mesh)
    return data_sharding, columnwise_sharding, rep, rep


@functools.partial(custom_partitioning, static_argnums=(2, 3, 4))
def _quantize_p(x, scale, fmt, rowwise, columnwise):
    return _ffi.quantize_call(x, scale, fmt, rowwise, columnwise)


_quantize_p.def_partition(
    partition=_quantize_partition, infer_sharding_from_operands=_quantize_infer,
    sharding_rule=lambda fmt, rowwise, columnwise, mesh, ops, res: quantize_rule_text(
        sh.rank_of(ops[0]), rowwise, columnwise, 2, True))


def quantize(x, scale, fmt, rowwise, columnwise):
    """(data, columnwise_data, scale_inv, amax); amax is global."""
    if sh.use_partitioned(x, scale):
        return _quantize_p(x, scale, fmt, rowwise, columnwise)
    return _ffi.quantize_call(x, scale, fmt, rowwise, columnwise)


def _row_axes(dims) -> tuple[str, ...]:
    """Mesh axes of the leading dims: the axes column sums add across."""
    return sh.flat_axes(dims[:-1])


def _psum_sums(sums, dims, sums_dtype):
    """Column sums of one shard summed across the shards of the rows (in
    float32, rounded once to sums_dtype); as they are when rows are whole."""
    axes = _row_axes(dims)
    if not axes:
        return sums
    return jax.lax.psum(sums, axes).astype(sums_dtype)


def _local_sums_dtype(dims, sums_dtype):
    """Shards of the rows add float32 partial sums (rounded after the psum)."""
    if sums_dtype is None or not _row_axes(dims):
        return sums_dtype
    return jnp.dtype(jnp.float32)


def _sums_sharding(mesh, dims, sums_dtype):
    return sh.named(mesh, dims[-1:]) if sums_dtype is not None else NamedSharding(mesh, P(None))


def _current_partition(fmt, rowwise, columnwise, amax_epsilon, power_2_scale, sums_dtype, mesh,
                       arg_shapes, result_shape):
    x = arg_shapes[0]
    dims = x_dims(mesh, x, columnwise)
    axes = sh.flat_axes(dims)

    @sh.per_shard
    def lower(x):
        if not axes:  # every device holds the whole tensor: the fused kernel
            return _ffi.quantize_current_scaling_call(x, fmt, rowwise, columnwise, amax_epsilon,
                                                      power_2_scale, sums_dtype)
        # The global amax first, then one scale for all shards, then the cast.
        amax = jax.lax.pmax(_ffi.amax_call(x), axes)
        scale, scale_inv = _ffi.compute_scale_call(amax, fmt, amax_epsilon, power_2_scale)
        if sums_dtype is None:
            data, columnwise_data, _, _ = _ffi.quantize_call(x, scale, fmt, rowwise, columnwise)
            return data, columnwise_data, scale, scale_inv, amax, jnp.zeros((0,), jnp.float32)
        # The cast that also sums columns: the fused delayed entry point with
        # record=0 and a seeded one-slot state holding this scale casts with
        # exactly that scale and leaves the state alone.
        call = _ffi.DelayedQuantize(fmts=(fmt,), copies=((rowwise, columnwise),),
                                    sums_dtypes=(_local_sums_dtype(dims, sums_dtype),),
                                    record=False, margin=0, amax_reduction="max")
        *_, [(data, columnwise_data, sums, _)] = _ffi.quantize_delayed_update_call(
            call, jnp.zeros((1, 1), jnp.float32), scale.reshape(1),
            jnp.ones((1,), jnp.float32), [x])
        return (data, columnwise_data, scale, scale_inv, amax,
                _psum_sums(sums, dims, sums_dtype))

    data, columnwise_data = fp8_result_shardings(mesh, dims, rowwise, columnwise)
    rep = sh.replicated(mesh)
    return (mesh, lower,
            (data, columnwise_data, rep, rep, rep, _sums_sharding(mesh, dims, sums_dtype)),
            (sh.named(mesh, dims),))


def _current_infer(fmt, rowwise, columnwise, amax_epsilon, power_2_scale, sums_dtype, mesh,
                   arg_shapes, result_shape):
    dims = x_dims(mesh, arg_shapes[0], columnwise)
    data, columnwise_data = fp8_result_shardings(mesh, dims, rowwise, columnwise)
    rep = sh.replicated(mesh)
    return data, columnwise_data, rep, rep, rep, _sums_sharding(mesh, dims, sums_dtype)


def _current_rule(fmt, rowwise, columnwise, amax_epsilon, power_2_scale, sums_dtype, mesh, ops,
                  res):
    rank = sh.rank_of(ops[0])
    text = quantize_rule_text(rank, rowwise, columnwise, 3, False)
    return text + (f", d{rank - 1}" if sums_dtype is not None else ", ps")


@functools.partial(custom_partitioning, static_argnums=(1, 2, 3, 4, 5, 6))
def _quantize_current_p(x, fmt, rowwise, columnwise, amax_epsilon, power_2_scale, sums_dtype):
    return _ffi.quantize_current_scaling_call(x, fmt, rowwise, columnwise, amax_epsilon,
                                              power_2_scale, sums_dtype)


_quantize_current_p.def_partition(
    partition=_current_partition, infer_sharding_from_operands=_current_infer,
    sharding_rule=_current_rule)


def quantize_current_scaling(x, fmt, rowwise, columnwise, amax_epsilon, power_2_scale,
                             sums_dtype=None):
    """(data, columnwise_data, scale, scale_inv, amax, sums) with one global
    scale; sums (column sums of x's 2-D view) only with a sums_dtype."""
    sums_dtype = None if sums_dtype is None else jnp.dtype(sums_dtype)
    if sh.use_partitioned(x):
        return _quantize_current_p(x, fmt, rowwise, columnwise, float(amax_epsilon),
                                   bool(power_2_scale), sums_dtype)
    return _ffi.quantize_current_scaling_call(x, fmt, rowwise, columnwise, amax_epsilon,
                                              power_2_scale, sums_dtype)


# --- delayed scaling: quantize, seed and record in one call ---------------------------------

def _delayed_dims(mesh, call: _ffi.DelayedQuantize, xs):
    return [x_dims(mesh, x, columnwise) for x, (_, columnwise) in zip(xs, call.copies)]


def _delayed_out_shardings(mesh, call: _ffi.DelayedQuantize, dims_per_input):
    rep = sh.replicated(mesh)
    out = [rep, rep, rep]  # amax_history, scale, seeded
    for dims, (rowwise, columnwise), sums_dtype in zip(dims_per_input, call.copies,
                                                       call.sums_dtypes):
        out += [*fp8_result_shardings(mesh, dims, rowwise, columnwise),
                _sums_sharding(mesh, dims, sums_dtype), rep]
    return tuple(out)


def _delayed_partition(call: _ffi.DelayedQuantize, mesh, arg_shapes, result_shape):
    xs = arg_shapes[3:]
    dims_per_input = _delayed_dims(mesh, call, xs)
    local = dataclasses.replace(call, sums_dtypes=tuple(
        _local_sums_dtype(d, s) for d, s in zip(dims_per_input, call.sums_dtypes)))

    @sh.per_shard
    def lower(amax_history, scale, seeded, *xs):
        # The state must not move on a shard's amax: each sharded input's
        # global amax (pmax over the axes it is split on) starts the core's
        # accumulator, so every shard seeds, casts and records exactly as
        # the unsharded call.
        amax = None
        if any(sh.flat_axes(d) for d in dims_per_input):
            amax = jnp.stack([
                jax.lax.pmax(_ffi.amax_call(x), sh.flat_axes(d)) if sh.flat_axes(d)
                else _ffi.amax_call(x) for x, d in zip(xs, dims_per_input)])
        history, scale, seeded, outputs = _ffi.quantize_delayed_update_call(
            local, amax_history, scale, seeded, xs, amax)
        flat = [history, scale, seeded]
        for (data, columnwise_data, sums, scale_inv), d, sums_dtype in zip(
                outputs, dims_per_input, call.sums_dtypes):
            if sums_dtype is not None:
                sums = _psum_sums(sums, d, sums_dtype)
            flat += [data, columnwise_data, sums, scale_inv]
        return tuple(flat)

    rep = sh.replicated(mesh)
    return (mesh, lower, _delayed_out_shardings(mesh, call, dims_per_input),
            (rep, rep, rep, *(sh.named(mesh, d) for d in dims_per_input)))


def _delayed_infer(call: _ffi.DelayedQuantize, mesh, arg_shapes, result_shape):
    return _delayed_out_shardings(mesh, call, _delayed_dims(mesh, call, arg_shapes[3:]))


def _delayed_rule(call: _ffi.DelayedQuantize, mesh, operand_types, result_types):
    operands, results = ["s l", "s", "s"], ["s l", "s", "s"]
    for i, (x, (rowwise, columnwise), sums_dtype) in enumerate(
            zip(operand_types[3:], call.copies, call.sums_dtypes)):
        f = sh.factors(sh.rank_of(x), prefix=f"x{i}d")
        operands.append(" ".join(f))
        results += [" ".join(f) if rowwise else f"r{i}",
                    _columnwise_factors(f, str(i)) if columnwise else f"c{i}",
                    f[-1] if sums_dtype is not None and f else f"s{i}", ""]
    return f"{', '.join(operands)} -> {', '.join(results)}"


def flatten_delayed(history, scale, seeded, outputs):
    """The flat results of the delayed call: the state, then four per input."""
    return (history, scale, seeded, *[a for out in outputs for a in out])


def unflatten_delayed(flat):
    """(history, scale, seeded, outputs) of flatten_delayed's results."""
    return (*flat[:3], [tuple(flat[3 + 4 * i:7 + 4 * i]) for i in range((len(flat) - 3) // 4)])


def _flat_delayed(call, amax_history, scale, seeded, *xs):
    return flatten_delayed(*_ffi.quantize_delayed_update_call(call, amax_history, scale,
                                                              seeded, xs))


@functools.partial(custom_partitioning, static_argnums=(0,))
def _quantize_delayed_p(call, amax_history, scale, seeded, *xs):
    return _flat_delayed(call, amax_history, scale, seeded, *xs)


_quantize_delayed_p.def_partition(partition=_delayed_partition,
                                  infer_sharding_from_operands=_delayed_infer,
                                  sharding_rule=_delayed_rule)


def quantize_delayed_update(call: _ffi.DelayedQuantize, amax_history, scale, seeded, xs):
    """_ffi.quantize_delayed_update_call, with the global amax of each
    sharded input when a mesh is in context."""
    args = (amax_history, scale, seeded, *xs)
    if sh.use_partitioned(*args):
        return unflatten_delayed(_quantize_delayed_p(call, *args))
    return _ffi.quantize_delayed_update_call(call, *args[:3], xs)
