"""The custom calls of the grouped ops (common/include/fp8kit/grouped.h):
one `*_call` per FFI target on one device's buffers, like _ffi.py (no
argument checks, no sharding). Their operand lists are in
jax_ext/grouped_ffi.cc.

Per-group scales are float32 [E, GROUP_SCALE_STRIDE], group g's in column
0; the grouped columnwise copy of a [T, F] tensor is flat,
F * columnwise_tokens(T, E) elements.

Block scaling (the `*_block_*` calls) works on the padded row layout of
fp8kit/grouped.h: `rows` rows, group g's p_g = m_g rounded up to
GEMM_DIM_MULTIPLE at row P_g = p_0 + ... + p_{g-1}; each copy's block
scales are one flat float32 array of block_scales_floats floats.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fp8kit.jax import _checks, _ffi

# Floats from one group's scale to the next (FP8KIT_GROUP_SCALE_STRIDE).
GROUP_SCALE_STRIDE: int = int(_ffi.ext.GROUP_SCALE_STRIDE)

# The most groups one grouped op takes (FP8KIT_MAX_GROUPS).
MAX_GROUPS: int = int(_ffi.ext.MAX_GROUPS)


def columnwise_tokens(tokens: int, groups: int) -> int:
    """fp8kit_grouped_columnwise_tokens: the token capacity of a grouped
    columnwise copy (each group padded to GEMM_DIM_MULTIPLE tokens)."""
    return int(_ffi.ext.grouped_columnwise_tokens(tokens, groups))


def sizes_operand(group_sizes) -> jax.Array:
    """The counts as the handlers read them: int64 [E] when JAX has int64
    arrays (jax_enable_x64), else int32 [E, 2], each count's low and high
    32-bit words, i.e. the bytes of an int64 on a little-endian device."""
    if group_sizes.dtype == jnp.int64:
        return group_sizes
    sizes = group_sizes.astype(jnp.int32)
    return jnp.stack([sizes, sizes >> 31], axis=-1)  # >> on int32: arithmetic


def _scales(groups: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((groups, GROUP_SCALE_STRIDE), jnp.float32)


def grouped_quantize_call(x, sizes, fmt: str, rowwise: bool, columnwise: bool,
                          amax_epsilon: float, power_2_scale: bool, scale=None):
    """fp8kit_grouped_quantize of x [T, F] in the groups of `sizes` (a
    sizes_operand): (data [T, F], flat grouped columnwise copy, scale,
    scale_inv, amax), placeholders for a copy not asked for. scale: given
    per-group scales, else current scaling from each group's amax."""
    tokens, features = x.shape
    groups = sizes.shape[0]
    dt = _checks.FP8_DTYPES[fmt]
    cw = (features * columnwise_tokens(tokens, groups),) if columnwise else _ffi.PLACEHOLDER
    results = (jax.ShapeDtypeStruct(tuple(x.shape) if rowwise else _ffi.PLACEHOLDER, dt),
               jax.ShapeDtypeStruct(cw, dt), _scales(groups), _scales(groups), _scales(groups))
    current = scale is None
    return jax.ffi.ffi_call("fp8kit_grouped_quantize", results, vmap_method="sequential")(
        x, sizes, _ffi.placeholder(jnp.float32) if current else scale, rowwise=bool(rowwise),
        columnwise=bool(columnwise), current=current, amax_epsilon=np.float32(amax_epsilon),
        power_2_scale=bool(power_2_scale))


def grouped_gemm_tokens_call(a, a_scale_inv, b, b_scale_inv, sizes, trans_b: bool,
                             b_columnwise: bool, out_dtype, use_split_accumulator: bool,
                             b_matrix: tuple[int, int], bias=None):
    """D [T, N], D_g = A_g @ op(B_g) for each group g: a [T, K] rowwise; b
    [E, R, C] (b_matrix = (R, C)), or with b_columnwise its columnwise copy
    [E, C, R], which may be the flat grouped columnwise buffer holding it
    (read without a slice); op(B_g) = B_g^T with trans_b. bias: [E, N] in
    the core's bias dtype for out_dtype, row g added to group g's rows."""
    rows, cols = b_matrix
    n = rows if trans_b else cols
    out = jax.ShapeDtypeStruct((a.shape[0], n), out_dtype)
    bias_arg = bias if bias is not None else _ffi.placeholder(_ffi.BIAS_DTYPE[jnp.dtype(out_dtype)])
    return jax.ffi.ffi_call("fp8kit_grouped_gemm_tokens", out, vmap_method="sequential")(
        a, a_scale_inv, b, b_scale_inv, bias_arg, sizes, trans_b=bool(trans_b),
        b_columnwise=bool(b_columnwise), has_bias=bias is not None,
        use_split_accumulator=bool(use_split_accumulator), b_rows=np.int64(rows),
        b_cols=np.int64(cols))


def grouped_gemm_contract_call(a_columnwise, a_scale_inv, b_columnwise, b_scale_inv, sizes,
                               tokens: int, m: int, n: int, out_dtype,
                               use_split_accumulator: bool):
    """D [E, M, N], D_g = A_g^T @ B_g summed over group g's tokens, from
    the flat grouped columnwise copies of a [T, M] and b [T, N]."""
    out = jax.ShapeDtypeStruct((sizes.shape[0], m, n), out_dtype)
    return jax.ffi.ffi_call("fp8kit_grouped_gemm_contract", out, vmap_method="sequential")(
        a_columnwise, a_scale_inv, b_columnwise, b_scale_inv, sizes, tokens=np.int64(tokens),
        use_split_accumulator=bool(use_split_accumulator))


def grouped_quantize_delayed_call(x, sizes, fmt: str, rowwise: bool, columnwise: bool,
                                  amax_history, scale, seeded, margin: int, amax_reduction: str,
                                  record: bool):
    """fp8kit_grouped_quantize_delayed_update of x [T, F] with one state per
    group (amax_history [E, len], scale and seeded [E, GROUP_SCALE_STRIDE]):
    (data, grouped columnwise copy, scale used, scale_inv, amax, new
    amax_history, new scale, new seeded); the state is returned unchanged
    unless `record`."""
    tokens, features = x.shape
    groups = sizes.shape[0]
    dt = _checks.FP8_DTYPES[fmt]
    cw = (features * columnwise_tokens(tokens, groups),) if columnwise else _ffi.PLACEHOLDER
    results = (jax.ShapeDtypeStruct(tuple(x.shape) if rowwise else _ffi.PLACEHOLDER, dt),
               jax.ShapeDtypeStruct(cw, dt), _scales(groups), _scales(groups), _scales(groups),
               jax.ShapeDtypeStruct(amax_history.shape, jnp.float32), _scales(groups),
               _scales(groups))
    # The state's results reuse its arguments' buffers where XLA can.
    return jax.ffi.ffi_call("fp8kit_grouped_quantize_delayed", results, vmap_method="sequential",
                            input_output_aliases={2: 5, 3: 6, 4: 7})(
        x, sizes, amax_history, scale, seeded, rowwise=bool(rowwise),
        columnwise=bool(columnwise), margin=np.int32(margin),
        amax_reduction=np.int32(_ffi.AMAX_REDUCTION_CODES[amax_reduction]), record=bool(record))


def block_scales_floats(rows: int, groups: int, features: int, scaling_mode: str,
                        columnwise: bool) -> int:
    """fp8kit_grouped_block_scales_floats: the floats of one copy's block
    scales of a padded grouped tensor [rows, features]."""
    return int(_ffi.ext.grouped_block_scales_floats(
        rows, groups, features, _ffi.SCALING_MODE_CODES[scaling_mode], bool(columnwise)))


def grouped_quantize_block_call(x, sizes, fmt: str, rowwise: bool, columnwise: bool,
                                scaling_mode: str, amax_epsilon: float, power_2_scale: bool,
                                tokens: int):
    """fp8kit_grouped_quantize_block of x [rows, F] in the padded row layout:
    (data [rows, F], columnwise copy [F, rows], block scales of each),
    placeholders for a copy not asked for. The sizes are first checked to
    sum to `tokens`, the real rows (fp8kit_grouped_check_sizes): the
    padded layout alone cannot tell a wrong count. tokens=-1 skips that
    (a read of the sizes) for sizes the caller made itself."""
    rows, features = x.shape
    groups = sizes.shape[0]
    dt = _checks.FP8_DTYPES[fmt]

    def scales(wanted, cw):
        n = block_scales_floats(rows, groups, features, scaling_mode, cw)
        return jax.ShapeDtypeStruct((n,) if wanted else _ffi.PLACEHOLDER, jnp.float32)

    results = (jax.ShapeDtypeStruct(tuple(x.shape) if rowwise else _ffi.PLACEHOLDER, dt),
               jax.ShapeDtypeStruct((features, rows) if columnwise else _ffi.PLACEHOLDER, dt),
               scales(rowwise, False), scales(columnwise, True))
    return jax.ffi.ffi_call("fp8kit_grouped_quantize_block", results, vmap_method="sequential")(
        x, sizes, rowwise=bool(rowwise), columnwise=bool(columnwise),
        scaling_mode=np.int32(_ffi.SCALING_MODE_CODES[scaling_mode]),
        amax_epsilon=np.float32(amax_epsilon), power_2_scale=bool(power_2_scale),
        tokens=np.int64(tokens))


def grouped_gemm_block_tokens_call(a, a_scales, a_mode: str, b, b_scales, b_mode: str, sizes,
                                   trans_b: bool, b_columnwise: bool, out_dtype,
                                   use_split_accumulator: bool, bias=None):
    """D [rows, N], D_g = A_g @ op(B_g) over group g's padded rows: a [rows,
    K] rowwise with its grouped block scales; b [E, R, C], or with
    b_columnwise its columnwise copy [E, C, R], with E matrices' scales.
    bias: [E, N] in out_dtype. Rows past the last group are not written."""
    rows, cols = (b.shape[2], b.shape[1]) if b_columnwise else (b.shape[1], b.shape[2])
    out = jax.ShapeDtypeStruct((a.shape[0], rows if trans_b else cols), out_dtype)
    bias_arg = bias if bias is not None else _ffi.placeholder(out_dtype)
    codes = _ffi.SCALING_MODE_CODES
    return jax.ffi.ffi_call("fp8kit_grouped_gemm_block_tokens", out, vmap_method="sequential")(
        a, a_scales, b, b_scales, bias_arg, sizes, trans_b=bool(trans_b),
        b_columnwise=bool(b_columnwise), has_bias=bias is not None,
        use_split_accumulator=bool(use_split_accumulator),
        a_scaling_mode=np.int32(codes[a_mode]), b_scaling_mode=np.int32(codes[b_mode]))


def grouped_gemm_block_contract_call(a_columnwise, a_scales, a_mode: str, b_columnwise, b_scales,
                                     b_mode: str, sizes, out_dtype, use_split_accumulator: bool):
    """D [E, M, N], D_g = A_g^T @ B_g over group g's padded tokens, from the
    columnwise copies a [M, rows] and b [N, rows] with their block scales."""
    (m, rows), n = a_columnwise.shape, b_columnwise.shape[0]
    out = jax.ShapeDtypeStruct((sizes.shape[0], m, n), out_dtype)
    codes = _ffi.SCALING_MODE_CODES
    return jax.ffi.ffi_call("fp8kit_grouped_gemm_block_contract", out, vmap_method="sequential")(
        a_columnwise, a_scales, b_columnwise, b_scales, sizes, rows=np.int64(rows),
        use_split_accumulator=bool(use_split_accumulator),
        a_scaling_mode=np.int32(codes[a_mode]), b_scaling_mode=np.int32(codes[b_mode]))
