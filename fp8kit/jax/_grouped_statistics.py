"""grouped_dense's cast statistics: each grouped cast read with each
expert's own scales, in one row of the layer's statistics rows
(fp8kit/jax/_statistics_rows.py) per tensor, with no host read of the
group sizes (they may be traced).

Per-tensor scaling: the rowwise copy read in one call with each row's
expert's scale_inv (the core's row-scaled statistics). Block scaling: the
tokens' grouped 1x128 scales (each expert's [tiles, p_e] block at its
padded offset, fp8kit/grouped.h) are gathered into the layout one tensor
of the padded rows would have (fp8kit/block_scaling.h), so that one call
reads them all; the kernels' 128x128 scales are each expert's matrix's
one after another, which is that one tensor's layout when K is a multiple
of 128 (else each expert is read on its own and the results merged).
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from fp8kit.jax import _ffi
from fp8kit.jax import _statistics_rows as rows_lib

_TILE = _ffi.BLOCK_LEN


def per_tensor(rows, row: int, t, data, scale_inv, row_groups, numel: int):
    """rows with row `row` the statistics of t [R, F]'s grouped per-tensor
    cast: data its rowwise copy, scale_inv [E, STRIDE] the groups', and
    row_groups [R] each row's group."""
    if rows is None:
        return None
    row_scale_inv = scale_inv[:, 0][row_groups]
    return rows_lib.record_parts(rows, row, [(t, data, row_scale_inv)], "per_row", numel)


def block_tokens(rows, row: int, padded, data, scales, group_sizes, numel: int):
    """The same for padded [rows, F] (the padded row layout) and its 1x128
    rowwise copy with the grouped scales `scales`."""
    if rows is None:
        return None
    n_rows, features = padded.shape
    tiles, inner = _ffi.block_scale_inv_shape("block_1x128", (n_rows, features), False)
    sizes = group_sizes.astype(jnp.int32)
    multiple = _ffi.GEMM_DIM_MULTIPLE
    p = (sizes + multiple - 1) // multiple * multiple
    ends = jnp.cumsum(p)
    starts = ends - p
    r = jnp.arange(n_rows, dtype=jnp.int32)
    group = jnp.searchsorted(ends, r, side="right")  # E for the rows after the last group
    inside = group < sizes.shape[0]
    group = jnp.minimum(group, sizes.shape[0] - 1)
    # Group g's tile (j, its row r - P_g) is at tiles * P_g + j * p_g + r - P_g.
    j = jnp.arange(tiles, dtype=jnp.int32)[:, None]
    at = tiles * starts[group][None, :] + j * p[group][None, :] + (r - starts[group])[None, :]
    plain = jnp.where(inside[None, :], scales[at], 0.0)  # [tiles, rows]: rows zero there
    plain = jnp.pad(plain, ((0, 0), (0, inner - n_rows)))
    return rows_lib.record_parts(rows, row, [(padded, data, plain)], "block_1x128", numel)


def block_kernels(rows, row: int, kernels, data, scales, experts: int):
    """The same for the kernels [E * K, N] cast as E matrices [K, N] with
    128x128 blocks: data the rowwise copy, scales each matrix's."""
    if rows is None:
        return None
    k, n = kernels.shape[0] // experts, kernels.shape[1]
    outer, inner = _ffi.block_scale_inv_shape("block_128x128", (k, n), False)
    if k % _TILE == 0:  # the experts' blocks are those of one [E * K, N] tensor
        parts = [(kernels, data, scales[:experts * outer * inner].reshape(experts * outer, inner))]
    else:
        size = outer * inner
        parts = [(kernels[e * k:(e + 1) * k], data[e * k:(e + 1) * k],
                  scales[e * size:(e + 1) * size].reshape(outer, inner))
                 for e in range(experts)]
    return rows_lib.record_parts(rows, row, parts, "block_128x128", math.prod(kernels.shape))
