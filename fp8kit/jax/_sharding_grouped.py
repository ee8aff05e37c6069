"""Sharding of the grouped custom calls (overview in _sharding.py):
gathered, each device running the whole call.

A token-grouped tensor sharded along its tokens does not split into
per-shard problems as a dense layer's tokens do: a group may straddle two
shards, so a shard's own group sizes, each group's current scale (the amax
over all of the group's tokens) and the weight gradient (a sum over the
group's tokens) all depend on the other shards. Experts sharded over a mesh
axis would need the tokens exchanged between devices (an all-to-all)
first. Until rules do that, the partition callbacks here replicate every
operand and result: the values are those of the unsharded call, bit for
bit, under any layout of the operands, at the cost of all-gathers and of
every device computing the whole grouped layer.
"""

from __future__ import annotations

import functools
import itertools

import jax
from jax.experimental.custom_partitioning import custom_partitioning

from fp8kit.jax import _ffi_grouped
from fp8kit.jax import _sharding as sh


def _quantize(static, x, sizes, *scale):
    return _ffi_grouped.grouped_quantize_call(x, sizes, *static, *scale)


def _tokens(static, a, a_scale_inv, b, b_scale_inv, sizes, *bias):
    return _ffi_grouped.grouped_gemm_tokens_call(a, a_scale_inv, b, b_scale_inv, sizes, *static,
                                                 *bias)


def _contract(static, a_columnwise, a_scale_inv, b_columnwise, b_scale_inv, sizes):
    return _ffi_grouped.grouped_gemm_contract_call(a_columnwise, a_scale_inv, b_columnwise,
                                                   b_scale_inv, sizes, *static)


def _quantize_delayed(static, x, sizes, amax_history, scale, seeded):
    fmt, rowwise, columnwise, margin, reduction, record = static
    return _ffi_grouped.grouped_quantize_delayed_call(x, sizes, fmt, rowwise, columnwise,
                                                      amax_history, scale, seeded, margin,
                                                      reduction, record)


def _quantize_block(static, x, sizes):
    return _ffi_grouped.grouped_quantize_block_call(x, sizes, *static)


def _block_tokens(static, a, a_scales, b, b_scales, sizes, *bias):
    a_mode, b_mode, *rest = static
    return _ffi_grouped.grouped_gemm_block_tokens_call(a, a_scales, a_mode, b, b_scales, b_mode,
                                                       sizes, *rest, *bias)


def _block_contract(static, a_columnwise, a_scales, b_columnwise, b_scales, sizes):
    a_mode, b_mode, *rest = static
    return _ffi_grouped.grouped_gemm_block_contract_call(a_columnwise, a_scales, a_mode,
                                                         b_columnwise, b_scales, b_mode, sizes,
                                                         *rest)


def _partition(call, static, mesh, arg_shapes, result_shape):
    rep = sh.replicated(mesh)
    lower = sh.per_shard(functools.partial(call, static))
    return mesh, lower, jax.tree.map(lambda _: rep, result_shape), (rep,) * len(arg_shapes)


def _infer(static, mesh, arg_shapes, result_shape):
    return jax.tree.map(lambda _: sh.replicated(mesh), result_shape)


def _rule(static, mesh, operand_types, result_types):
    """Every dimension a factor of its own, none of which may be sharded."""
    names = (f"f{i}" for i in itertools.count())
    results = result_types if isinstance(result_types, (list, tuple)) else [result_types]
    operands = [" ".join(next(names) for _ in range(sh.rank_of(t))) for t in operand_types]
    outs = [" ".join(next(names) for _ in range(sh.rank_of(t))) for t in results]
    every = tuple(f for text in operands + outs for f in text.split())
    return f"{', '.join(operands)} -> {', '.join(outs)}", {"need_replication_factors": every}


def _replicated(call):
    prim = custom_partitioning(call, static_argnums=(0,))
    prim.def_partition(partition=functools.partial(_partition, call),
                       infer_sharding_from_operands=_infer, sharding_rule=_rule)
    return prim


_quantize_p = _replicated(_quantize)
_tokens_p = _replicated(_tokens)
_contract_p = _replicated(_contract)
_quantize_delayed_p = _replicated(_quantize_delayed)
_quantize_block_p = _replicated(_quantize_block)
_block_tokens_p = _replicated(_block_tokens)
_block_contract_p = _replicated(_block_contract)


def _dispatch(prim, call, static, *args):
    return prim(static, *args) if sh.use_partitioned(*args) else call(static, *args)


def grouped_quantize(x, sizes, fmt: str, rowwise: bool, columnwise: bool, amax_epsilon: float,
                     power_2_scale: bool):
    """Current-scaling grouped_quantize_call; gathered under a mesh."""
    static = (fmt, bool(rowwise), bool(columnwise), float(amax_epsilon), bool(power_2_scale))
    return _dispatch(_quantize_p, _quantize, static, x, sizes)


def grouped_gemm_tokens(a, a_scale_inv, b, b_scale_inv, sizes, trans_b: bool,
                        b_columnwise: bool, out_dtype, use_split_accumulator: bool,
                        b_matrix: tuple[int, int], bias=None):
    """grouped_gemm_tokens_call; gathered under a mesh."""
    static = (bool(trans_b), bool(b_columnwise), out_dtype, bool(use_split_accumulator),
              tuple(int(d) for d in b_matrix))
    args = (a, a_scale_inv, b, b_scale_inv, sizes) + (() if bias is None else (bias,))
    return _dispatch(_tokens_p, _tokens, static, *args)


def grouped_gemm_contract(a_columnwise, a_scale_inv, b_columnwise, b_scale_inv, sizes,
                          tokens: int, m: int, n: int, out_dtype, use_split_accumulator: bool):
    """grouped_gemm_contract_call; gathered under a mesh."""
    static = (int(tokens), int(m), int(n), out_dtype, bool(use_split_accumulator))
    return _dispatch(_contract_p, _contract, static, a_columnwise, a_scale_inv, b_columnwise,
                     b_scale_inv, sizes)


def grouped_quantize_delayed(x, sizes, fmt: str, rowwise: bool, columnwise: bool, amax_history,
                             scale, seeded, margin: int, amax_reduction: str, record: bool):
    """grouped_quantize_delayed_call; gathered under a mesh."""
    static = (fmt, bool(rowwise), bool(columnwise), int(margin), amax_reduction, bool(record))
    return _dispatch(_quantize_delayed_p, _quantize_delayed, static, x, sizes, amax_history,
                     scale, seeded)


def grouped_quantize_block(x, sizes, fmt: str, rowwise: bool, columnwise: bool,
                           scaling_mode: str, amax_epsilon: float, power_2_scale: bool,
                           tokens: int):
    """grouped_quantize_block_call; gathered under a mesh."""
    static = (fmt, bool(rowwise), bool(columnwise), scaling_mode, float(amax_epsilon),
              bool(power_2_scale), int(tokens))
    return _dispatch(_quantize_block_p, _quantize_block, static, x, sizes)


def grouped_gemm_block_tokens(a, a_scales, a_mode: str, b, b_scales, b_mode: str, sizes,
                              trans_b: bool, b_columnwise: bool, out_dtype,
                              use_split_accumulator: bool, bias=None):
    """grouped_gemm_block_tokens_call; gathered under a mesh."""
    static = (a_mode, b_mode, bool(trans_b), bool(b_columnwise), out_dtype,
              bool(use_split_accumulator))
    args = (a, a_scales, b, b_scales, sizes) + (() if bias is None else (bias,))
    return _dispatch(_block_tokens_p, _block_tokens, static, *args)


def grouped_gemm_block_contract(a_columnwise, a_scales, a_mode: str, b_columnwise, b_scales,
                                b_mode: str, sizes, out_dtype, use_split_accumulator: bool):
    """grouped_gemm_block_contract_call; gathered under a mesh."""
    static = (a_mode, b_mode, out_dtype, bool(use_split_accumulator))
    return _dispatch(_block_contract_p, _block_contract, static, a_columnwise, a_scales,
                     b_columnwise, b_scales, sizes)
