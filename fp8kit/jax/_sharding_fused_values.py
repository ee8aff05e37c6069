"""The fused norm and activation without their FP8 cast (block scaling's
layers: _fused_block_steps.py), sharded as _sharding_fused.py shards the
casting calls: over the rows (tokens), and the activation over its
features too (SwiGLU's h paired, [rows, 2, F], when they are split).

With no cast there is no scale to agree on: each device runs the kernel
on its shard as it is, and no collective is needed. Under Explicit mesh
axes the results are typed as the partitioner lays them out (rows as the
input's, the activation's features as h's), since a custom call's result
is otherwise typed replicated and the block cast that reads it would
gather it. Without a mesh, or under jax.vmap, the plain custom calls run.
"""

from __future__ import annotations

import functools

from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec as P

from fp8kit.jax import _ffi
from fp8kit.jax import _ffi_fused as fused
from fp8kit.jax import _sharding as sh
from fp8kit.jax._sharding_fused import activation_dims, paired, row_axes, rows_sharding


# --- norm forward ------------------------------------------------------------------------

def _norm_shardings(norm, mesh, x_shape):
    """(y, mean, rsigma) and (x, gamma, beta) shardings: rows split as x's
    are, the hidden dimension and the parameters replicated."""
    axes = row_axes(mesh, x_shape)
    stats = (rows_sharding(mesh, axes, 1) if norm == "layernorm"
             else NamedSharding(mesh, P(None)))
    rep = sh.replicated(mesh)
    return ((rows_sharding(mesh, axes), stats, rows_sharding(mesh, axes, 1)),
            (rows_sharding(mesh, axes), rep, rep))


def _norm_partition(norm, epsilon, mesh, arg_shapes, result_shape):
    @sh.per_shard
    def lower(x, gamma, beta):
        return fused.norm_forward_values_call(x, gamma, beta, norm, epsilon)

    out, args = _norm_shardings(norm, mesh, arg_shapes[0])
    return mesh, lower, out, args


def _norm_infer(norm, epsilon, mesh, arg_shapes, result_shape):
    return _norm_shardings(norm, mesh, arg_shapes[0])[0]


def _norm_rule(norm, epsilon, mesh, operand_types, result_types):
    beta, mean = ("h", "r") if norm == "layernorm" else ("pb", "pm")
    return f"r h, h, {beta} -> r h, {mean}, r"


@functools.partial(custom_partitioning, static_argnums=(0, 1))
def _norm_p(norm, epsilon, x, gamma, beta):
    return fused.norm_forward_values_call(x, gamma, beta, norm, epsilon)


_norm_p.def_partition(partition=_norm_partition, infer_sharding_from_operands=_norm_infer,
                      sharding_rule=_norm_rule)


def norm_forward(x, gamma, beta, norm: str, epsilon: float):
    """(y in x's dtype, mean (LayerNorm) or None, rsigma) of x [rows,
    hidden]; beta None for RMSNorm."""
    if beta is None:
        beta = _ffi.placeholder(x.dtype)
    if not sh.use_partitioned(x, gamma, beta):
        y, mean, rsigma = fused.norm_forward_values_call(x, gamma, beta, norm, epsilon)
        return y, (mean if norm == "layernorm" else None), rsigma
    y, mean, rsigma = _norm_p(norm, float(epsilon), x, gamma, beta)
    spec = sh.explicit_spec(x)
    if spec is not None:
        rows = sh.spec_axes(spec, 0)
        y = sh.retype(y, sh.spec_of([rows, ()]))
        rsigma = sh.retype(rsigma, sh.spec_of([rows]))
        mean = sh.retype(mean, sh.spec_of([rows])) if norm == "layernorm" else mean
    return y, (mean if norm == "layernorm" else None), rsigma


# --- activation forward and backward -----------------------------------------------------

def _call(backward: bool, tensors, activation: str):
    """act(h), or dh = d_a * act'(h) shaped as h, on tensors (h,) or
    (d_a, h). A paired h [rows, 2, F] goes to the core as the
    [rows, 2F] = [gate | up] it reads."""
    *d_a, h = tensors
    view = sh.rows_view(h) if paired(h.shape) else h
    if not backward:
        return fused.activation_forward_values_call(view, activation)
    return fused.activation_backward_values_call(*d_a, view, activation).reshape(h.shape)


def _activation_partition(backward, activation, mesh, arg_shapes, result_shape):
    rows, features, h_dims, v_dims = activation_dims(backward, activation, mesh, arg_shapes[-1])

    @sh.per_shard
    def lower(*tensors):
        return _call(backward, tensors, activation)

    d_a = (sh.named(mesh, [rows, features]),) if backward else ()
    return mesh, lower, sh.named(mesh, v_dims), (*d_a, sh.named(mesh, h_dims))


def _activation_infer(backward, activation, mesh, arg_shapes, result_shape):
    return sh.named(mesh, activation_dims(backward, activation, mesh, arg_shapes[-1])[3])


def _activation_rule(backward, activation, mesh, operand_types, result_types):
    # As _sharding_fused's: a and d_a are [r, f]; h is GELU's [r, f],
    # SwiGLU's [r, g] = [gate | up] or its paired [r, two, f].
    if activation == "gelu":
        h = "f"
    else:
        h = "two f" if paired(operand_types[-1].shape) else "g"
    return f"r f, r {h} -> r {h}" if backward else f"r {h} -> r f"


@functools.partial(custom_partitioning, static_argnums=(0, 1))
def _activation_p(backward, activation, *tensors):
    return _call(backward, tensors, activation)


_activation_p.def_partition(partition=_activation_partition,
                            infer_sharding_from_operands=_activation_infer,
                            sharding_rule=_activation_rule)


def _activation(backward: bool, tensors, activation: str):
    if not sh.use_partitioned(*tensors):
        return _call(backward, tensors, activation)
    out = _activation_p(backward, activation, *tensors)
    h = tensors[-1]
    spec = sh.explicit_spec(h)
    if spec is None:
        return out
    if backward:  # dh: h's layout
        return sh.retype(out, spec)
    return sh.retype(out, sh.spec_of([sh.spec_axes(spec, 0), sh.spec_axes(spec, h.ndim - 1)]))


def activation_forward(h, activation: str):
    """a = act(h) in h's dtype; h [rows, F], [rows, 2F] or SwiGLU's paired
    [rows, 2, F]."""
    return _activation(False, (h,), activation)


def activation_backward(d_a, h, activation: str):
    """dh = d_a * act'(h) in h's dtype, shaped as h."""
    return _activation(True, (d_a, h), activation)
