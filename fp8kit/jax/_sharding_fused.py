"""Sharding rules of the fused norm and activation calls (overview in
_sharding.py): data parallel over the rows (tokens), and tensor parallel
over the activation's features.

Every fused op works row by row, so a shard of the rows runs the op on its
rows with the parameters (gamma, beta) replicated. The norm's hidden
dimension is replicated (gathered if it came sharded). The activation's
features (F, the last dim of h) may be sharded too (Megatron's layout:
fc1's kernel split along its outputs, fc2's along its inputs): each device
applies the activation to its columns. SwiGLU pairs column j of the gate
with column j of the up projection, so its h must come paired,
[rows, 2, F] (gate h[:, 0], up h[:, 1]): a device's slice of F then holds
both halves of its pairs, which it passes to the core as the
[rows, 2F_local] = [gate | up] the kernel reads. The unpaired
[rows, 2F] = [gate | up] sharded along its columns would give one device
gates and another their ups: refused with a ValueError. A feature slice
that is not a multiple of the GEMM alignment is replicated.

The FP8 cast must not depend on the shard: the cast of a sharded input is
started at the global amax of the values it casts (pmax over the row and
feature axes; like the delayed quantize rule of _sharding_quantize.py):

  delayed   a first pass on the shard with a throwaway current-scaling
            cast gives the shard's amax of v; pmax over the row (and
            feature) axes gives the global one, which starts the state's
            amax accumulator, so every shard seeds, casts and records
            exactly as the unsharded call and the state stays replicated
            and identical;
  current   the same global amax, then the scale (fp8kit_compute_scale),
            then the cast with that scale through the delayed target on a
            seeded one-slot state holding it (it records into that
            throwaway state only).

Column sums (the activation backward's bias gradient, sharded as the
features are) are summed across the row shards in float32 (psum), then
rounded, as in _sharding_quantize.py. The norm backward's dgamma and dbeta
are summed the same way. The high-precision values cast, when a cast asks
for them (FusedCast.high_precision), are sharded as the rowwise copy.
Without a mesh, or under jax.vmap, the plain custom calls run.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec as P

from fp8kit.jax import _ffi
from fp8kit.jax import _ffi_fused as fused
from fp8kit.jax import _sharding as sh

F32 = jnp.float32


def row_axes(mesh, arg_shape) -> tuple[str, ...]:
    """The mesh axes of the rows of a [rows, cols] argument, when they split
    the rows evenly (else (): replicate)."""
    return sh.even(mesh, arg_shape.shape[0], sh.spec(arg_shape)[0])


def rows_sharding(mesh, axes, ndim: int = 2) -> NamedSharding:
    """Rows on `axes`, every other dim replicated."""
    return sh.named(mesh, [axes] + [()] * (ndim - 1))


# --- the cast of one shard with the global amax ----------------------------------------

def _amax_pass(cast: fused.FusedCast) -> fused.FusedCast:
    """A current-scaling cast of the rowwise copy only: its amax result is
    the shard's max |v| (the FP8 bytes are thrown away)."""
    return fused.FusedCast(fmt=cast.fmt, copies=(True, False), delayed=False)


def _global_cast(cast: fused.FusedCast, state, axes, run):
    """Runs `run(cast, state, amax)` (one fused call) on a shard so that it
    casts with the unsharded call's scale: `run` is first called with an
    amax-only cast, then with the real one (see the module docstring).
    Returns (CastResult with the caller's state, extras of the last call)."""
    first, _ = run(_amax_pass(cast), None, None)
    amax = jax.lax.pmax(first.amax, axes)
    if cast.delayed:
        return run(cast, state, amax)
    scale, scale_inv = _ffi.compute_scale_call(amax, cast.fmt, cast.amax_epsilon,
                                               cast.power_2_scale)
    given = dataclasses.replace(cast, delayed=True, record=True, slot=0)
    one_slot = fused.DelayedState(jnp.zeros((1, 1), F32), jnp.reshape(scale, (1,)),
                                  jnp.ones((1,), F32))
    result, extras = run(given, one_slot, None)
    return dataclasses.replace(result, state=None, amax=amax, scale_inv=scale_inv), extras


def _state_placeholders():
    """The state operands and results of a current-scaling call (unused)."""
    return jnp.zeros((0, 0), F32), jnp.zeros((0,), F32), jnp.zeros((0,), F32)


def _flat(result: fused.CastResult, extras=()):
    """Flat results of a partitioned cast: state (3, or 3 placeholders
    under current scaling), data, columnwise_data, scale_inv, sums, the
    high-precision values (only when cast), extras."""
    st = result.state
    state = (st.amax_history, st.scale, st.seeded) if st is not None else _state_placeholders()
    sums = result.sums if result.sums is not None else _ffi.placeholder(F32)
    hp = () if result.high_precision is None else (result.high_precision,)
    return (*state, result.data, result.columnwise_data, result.scale_inv, sums, *hp, *extras)


def _unflat(cast: fused.FusedCast, flat):
    state = fused.DelayedState(*flat[:3]) if cast.delayed else None
    sums = flat[6] if cast.sums_dtype is not None else None
    hp = flat[7] if cast.high_precision else None
    return (fused.CastResult(flat[3], flat[4], flat[5], state, None, sums, hp),
            tuple(flat[7 + cast.high_precision:]))


def _cast_out_shardings(mesh, cast: fused.FusedCast, v_dims):
    """Shardings of _flat's cast results for v with mesh axes v_dims per
    dim (rows first; the columnwise copy puts them last)."""
    rep, rep1 = sh.replicated(mesh), NamedSharding(mesh, P(None))
    data = sh.named(mesh, v_dims) if cast.copies[0] else rep1
    columnwise = sh.named(mesh, [*v_dims[1:], v_dims[0]]) if cast.copies[1] else rep1
    sums = sh.named(mesh, v_dims[1:]) if cast.sums_dtype is not None else rep1
    hp = (sh.named(mesh, v_dims),) if cast.high_precision else ()
    return (rep, rep, rep, data, columnwise, rep, sums, *hp)


def _state_args(cast, state):
    return ((state.amax_history, state.scale, state.seeded) if cast.delayed
            else _state_placeholders())


def _psum_sums(result: fused.CastResult, cast: fused.FusedCast, axes):
    if result.sums is None or not axes:
        return result
    return dataclasses.replace(result, sums=jax.lax.psum(result.sums, axes).astype(
        cast.sums_dtype))


def _cast_rule(prefix: str, v_cols: str, cast: fused.FusedCast) -> str:
    data = f"r {v_cols}" if cast.copies[0] else "pd"
    columnwise = f"{v_cols} r" if cast.copies[1] else "pc"
    sums = v_cols if cast.sums_dtype is not None else "ps"
    hp = f", r {v_cols}" if cast.high_precision else ""
    return f"{prefix} -> s l, s, s, {data}, {columnwise}, , {sums}{hp}"


# --- norm forward ------------------------------------------------------------------------

def _norm_forward_plain(cast, state, x, gamma, beta, norm, epsilon, amax=None):
    result, mean, rsigma = fused.norm_forward_call(cast, state, x, gamma, beta, norm, epsilon,
                                                   amax)
    return result, (mean, rsigma)


def _norm_forward_partition(cast, norm, epsilon, mesh, arg_shapes, result_shape):
    axes = row_axes(mesh, arg_shapes[3])

    @sh.per_shard
    def lower(history, scale, seeded, x, gamma, beta):
        state = fused.DelayedState(history, scale, seeded) if cast.delayed else None
        run = lambda c, s, a: _norm_forward_plain(c, s, x, gamma, beta, norm, epsilon, a)  # noqa: E731
        if axes:
            result, extras = _global_cast(cast, state, axes, run)
        else:
            result, extras = run(cast, state, None)
        return _flat(result, extras)

    rep = sh.replicated(mesh)
    stats = rows_sharding(mesh, axes, 1) if norm == "layernorm" else NamedSharding(mesh, P(None))
    out = (*_cast_out_shardings(mesh, cast, [axes, ()]), stats, rows_sharding(mesh, axes, 1))
    return mesh, lower, out, (rep, rep, rep, rows_sharding(mesh, axes), rep, rep)


def _norm_forward_infer(cast, norm, epsilon, mesh, arg_shapes, result_shape):
    axes = row_axes(mesh, arg_shapes[3])
    stats = rows_sharding(mesh, axes, 1) if norm == "layernorm" else NamedSharding(mesh, P(None))
    return (*_cast_out_shardings(mesh, cast, [axes, ()]), stats, rows_sharding(mesh, axes, 1))


def _norm_forward_rule(cast, norm, epsilon, mesh, operand_types, result_types):
    mean = "r" if norm == "layernorm" else "pm"
    beta = "h" if norm == "layernorm" else "b"
    text = _cast_rule(f"s l, s, s, r h, h, {beta}", "h", cast)
    return f"{text}, {mean}, r"


@functools.partial(custom_partitioning, static_argnums=(0, 1, 2))
def _norm_forward_p(cast, norm, epsilon, history, scale, seeded, x, gamma, beta):
    state = fused.DelayedState(history, scale, seeded) if cast.delayed else None
    return _flat(*_norm_forward_plain(cast, state, x, gamma, beta, norm, epsilon))


_norm_forward_p.def_partition(partition=_norm_forward_partition,
                              infer_sharding_from_operands=_norm_forward_infer,
                              sharding_rule=_norm_forward_rule)


def norm_forward(cast: fused.FusedCast, state, x, gamma, beta, norm: str, epsilon: float):
    """(CastResult, mean, rsigma) of the norm of x [rows, hidden]."""
    beta = beta if beta is not None else _ffi.placeholder(x.dtype)
    if not sh.use_partitioned(x, gamma, beta, state):
        result, (mean, rsigma) = _norm_forward_plain(cast, state, x, gamma, beta, norm, epsilon)
        return result, mean, rsigma
    flat = _norm_forward_p(cast, norm, float(epsilon), *_state_args(cast, state), x, gamma, beta)
    result, (mean, rsigma) = _unflat(cast, flat)
    return result, mean, rsigma


# --- norm backward -----------------------------------------------------------------------

def _norm_backward_partition(norm, epsilon, param_dtype, mesh, arg_shapes, result_shape):
    axes = row_axes(mesh, arg_shapes[1])
    layernorm = norm == "layernorm"

    @sh.per_shard
    def lower(dy, x, mean, rsigma, gamma):
        # dgamma and dbeta of a shard in float32, summed over the shards,
        # rounded once.
        dx, dgamma, dbeta = fused.norm_backward_call(dy, x, mean, rsigma, gamma, norm, epsilon,
                                                     F32 if axes else param_dtype)
        if axes:
            dgamma = jax.lax.psum(dgamma, axes).astype(param_dtype)
            dbeta = jax.lax.psum(dbeta, axes).astype(param_dtype) if layernorm else None
        return dx, dgamma, dbeta if layernorm else _ffi.placeholder(param_dtype)

    rep = sh.replicated(mesh)
    stats = rows_sharding(mesh, axes, 1) if layernorm else NamedSharding(mesh, P(None))
    return (mesh, lower, (rows_sharding(mesh, axes), rep, rep),
            (rows_sharding(mesh, axes), rows_sharding(mesh, axes), stats, rows_sharding(mesh, axes, 1), rep))


def _norm_backward_infer(norm, epsilon, param_dtype, mesh, arg_shapes, result_shape):
    rep = sh.replicated(mesh)
    return rows_sharding(mesh, row_axes(mesh, arg_shapes[1])), rep, rep


def _norm_backward_rule(norm, epsilon, param_dtype, mesh, operand_types, result_types):
    mean, dbeta = ("r", "h") if norm == "layernorm" else ("pm", "pb")
    # r is not a reduction factor (dx keeps it); the partition callback
    # sums dgamma and dbeta over the row shards itself.
    return f"r h, r h, {mean}, r, h -> r h, h, {dbeta}"


@functools.partial(custom_partitioning, static_argnums=(0, 1, 2))
def _norm_backward_p(norm, epsilon, param_dtype, dy, x, mean, rsigma, gamma):
    dx, dgamma, dbeta = fused.norm_backward_call(dy, x, mean, rsigma, gamma, norm, epsilon,
                                                 param_dtype)
    return dx, dgamma, dbeta if dbeta is not None else _ffi.placeholder(param_dtype)


_norm_backward_p.def_partition(partition=_norm_backward_partition,
                               infer_sharding_from_operands=_norm_backward_infer,
                               sharding_rule=_norm_backward_rule)


def norm_backward(dy, x, mean, rsigma, gamma, norm: str, epsilon: float, param_dtype):
    """(dx, dgamma, dbeta or None)."""
    param_dtype = jnp.dtype(param_dtype)
    if not sh.use_partitioned(dy, x, mean, rsigma, gamma):
        return fused.norm_backward_call(dy, x, mean, rsigma, gamma, norm, epsilon, param_dtype)
    dx, dgamma, dbeta = _norm_backward_p(norm, float(epsilon), param_dtype, dy, x, mean, rsigma,
                                         gamma)
    return dx, dgamma, dbeta if norm == "layernorm" else None


# --- activation forward and backward ---------------------------------------------------------

def unpaired_swiglu_message(axes) -> str:
    """The refusal of SwiGLU's [rows, 2F] = [gate | up] split along its
    columns (fp8kit.jax.layernorm_mlp's kernel_1 [hidden, 2F] sharded so)."""
    return ("fp8kit.jax.layernorm_mlp: SwiGLU's kernel_1 [hidden, 2F] = [gate | up] (and so fc1's "
            f"output) has its columns sharded over mesh axes {tuple(axes)}: a device would hold "
            "gate columns without the up columns they multiply. For tensor parallelism pass "
            "kernel_1 in the paired layout [hidden, 2, F] (kernel_1.reshape(hidden, 2, F): gate "
            "kernel_1[:, 0], up kernel_1[:, 1]) and bias_1 as [2, F], and shard their last "
            "dimension; or leave kernel_1's columns replicated.")


def paired(h_shape) -> bool:
    """Is h SwiGLU's paired [rows, 2, F] (else [rows, F] or [rows, 2F])?"""
    return len(h_shape) == 3


def _activation_call(backward: bool, cast, state, tensors, activation: str, amax=None):
    """One fused activation call (on a device's shard, or unpartitioned) on
    tensors = (h,) or (d_a, h). A paired h [rows, 2, F] goes to the core as
    the [rows, 2F] = [gate | up] it reads (on a device, its F columns of
    both halves), and dh comes back paired: data and the high-precision
    dh [rows, 2, F], columnwise_data [2, F, rows], sums [2, F]."""
    *d_a, h = tensors
    call = fused.activation_backward_call if backward else fused.activation_forward_call
    if not paired(h.shape):
        return call(cast, state, *d_a, h, activation, amax)
    rows, _, f = h.shape
    result = call(cast, state, *d_a, sh.rows_view(h), activation, amax)
    if not backward:
        return result
    rowwise, columnwise = cast.copies
    return dataclasses.replace(
        result, data=result.data.reshape(rows, 2, f) if rowwise else result.data,
        columnwise_data=(result.columnwise_data.reshape(2, f, rows) if columnwise
                         else result.columnwise_data),
        sums=result.sums.reshape(2, f) if cast.sums_dtype is not None else result.sums,
        high_precision=(result.high_precision.reshape(h.shape) if cast.high_precision
                        else None))


def activation_dims(backward: bool, activation: str, mesh, h):
    """(row axes, feature axes, mesh axes per dim of h, of v (the cast
    values: a forward, dh backward)). The features are split when h's last
    dim is, evenly, into multiples of the GEMM alignment (the next GEMM's
    K); an unpaired SwiGLU h split along its columns is refused."""
    rows = row_axes(mesh, h)
    split = sh.spec(h)[-1]
    if split and activation == "swiglu" and not paired(h.shape):
        raise ValueError(unpaired_swiglu_message(split))
    features = sh.even(mesh, h.shape[-1], split, _ffi.GEMM_DIM_MULTIPLE)
    h_dims = [rows, (), features] if paired(h.shape) else [rows, features]
    return rows, features, h_dims, h_dims if backward else [rows, features]


def _activation_partition(backward, cast, activation, mesh, arg_shapes, result_shape):
    rows, features, h_dims, v_dims = activation_dims(backward, activation, mesh, arg_shapes[-1])
    amax_axes = rows + features
    local = cast
    if rows and cast.sums_dtype is not None:  # float32 partial sums, rounded after the psum
        local = dataclasses.replace(cast, sums_dtype=jnp.dtype(F32))

    @sh.per_shard
    def lower(history, scale, seeded, *tensors):
        state = fused.DelayedState(history, scale, seeded) if cast.delayed else None

        def run(c, s, a):
            return _activation_call(backward, c, s, tensors, activation, a), ()

        if not amax_axes:
            result, _ = run(cast, state, None)
            return _flat(result)
        result, _ = _global_cast(local, state, amax_axes, run)
        return _flat(_psum_sums(result, cast, rows))

    rep = sh.replicated(mesh)
    d_a = (sh.named(mesh, [rows, features]),) if backward else ()
    return (mesh, lower, _cast_out_shardings(mesh, cast, v_dims),
            (rep, rep, rep, *d_a, sh.named(mesh, h_dims)))


def _activation_infer(backward, cast, activation, mesh, arg_shapes, result_shape):
    *_, v_dims = activation_dims(backward, activation, mesh, arg_shapes[-1])
    return _cast_out_shardings(mesh, cast, v_dims)


def _activation_rule(backward, cast, activation, mesh, operand_types, result_types):
    # a (forward) and d_a (backward) are [r, f]. GELU's h is [r, f] too;
    # SwiGLU's [r, g] = [gate | up] (g = 2f, no sharding passes between g
    # and f) or paired [r, two, f] (a device's f columns of both halves).
    if activation == "gelu":
        h = "f"
    else:
        h = "two f" if paired(operand_types[-1].shape) else "g"
    prefix = f"s l, s, s, r f, r {h}" if backward else f"s l, s, s, r {h}"
    return _cast_rule(prefix, h if backward else "f", cast)


@functools.partial(custom_partitioning, static_argnums=(0, 1, 2))
def _activation_p(backward, cast, activation, history, scale, seeded, *tensors):
    state = fused.DelayedState(history, scale, seeded) if cast.delayed else None
    return _flat(_activation_call(backward, cast, state, tensors, activation))


_activation_p.def_partition(partition=_activation_partition,
                            infer_sharding_from_operands=_activation_infer,
                            sharding_rule=_activation_rule)


def _activation(backward: bool, cast, state, tensors, activation):
    if not sh.use_partitioned(*tensors, state):
        return _activation_call(backward, cast, state, tensors, activation)
    flat = _activation_p(backward, cast, activation, *_state_args(cast, state), *tensors)
    return _unflat(cast, flat)[0]


def activation_forward(cast: fused.FusedCast, state, h, activation: str) -> fused.CastResult:
    """The cast of a = act(h); h [rows, F], [rows, 2F] or SwiGLU's paired
    [rows, 2, F]."""
    return _activation(False, cast, state, (h,), activation)


def activation_backward(cast: fused.FusedCast, state, d_a, h, activation: str):
    """The cast of dh = d_a * act'(h), shaped as h (paired: see
    _activation_call)."""
    return _activation(True, cast, state, (d_a, h), activation)
