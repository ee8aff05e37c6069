"""fp8kit.jax.grouped_dense: the expert layer of a mixture of experts, E
dense layers each applied to its own group of tokens, with FP8 GEMMs; the
semantics of jax.lax.ragged_dot (plus a bias per expert):

    y = grouped_dense(x, kernels, group_sizes, bias, recipe=CurrentScaling())
    y[t] = x[t] @ kernels[e] + bias[e]    for the expert e token t belongs to

x [T, K] holds the tokens of expert 0, then those of expert 1, and so on
(contiguous layout); group_sizes (int32 or int64 [E], zero allowed) counts
each expert's tokens and must sum to T. kernels [E, K, N], bias [E, N].

Under CurrentScaling every operand has one scale per expert, from that
expert's own amax (its tokens of x and of the output gradient, its kernel
matrix), so each expert's values are bit for bit those of fp8kit.jax.dense
on its tokens alone. The casts of all experts are one custom call per
tensor, the GEMMs one per pass (common/include/fp8kit/grouped.h):

Forward:  y_e  = Q(x_e) @ Q(kernel_e)          grouped GEMM over tokens
Backward: dx_e = Q(dy_e) @ Q(kernel_e)^T        grouped GEMM over tokens
          dk_e = Q(x_e)^T @ Q(dy_e)             grouped GEMM contracting each
                                                expert's tokens (zero for an
                                                expert with none)
          db_e = the sum of dy_e, in float32    (jax.ops.segment_sum)

The kernels are cast as one token-grouped [E * K, N] tensor of E groups of
K rows: its rowwise copy is [E, K, N] (what dgrad reads) and its grouped
columnwise copy begins with each expert's transpose [N, K] back to back (K
is a multiple of 16, so no group is padded), which the forward GEMM reads
K-contiguous. Backward keeps x and the kernels in FP8 only.

The core reads the group sizes on the host (on a GPU: a copy and a wait
for the stream per grouped call), so these calls are never captured into
XLA's CUDA graphs. Counts that do not sum to T are a ValueError when they
are concrete; under jit the core refuses them when the program runs (an
XLA runtime error naming group_sizes). Under a mesh the grouped calls are
gathered and run whole on every device (fp8kit/jax/_sharding_grouped.py
says why). DelayedScaling (a history per expert) and BlockScaling are not
supported yet.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from fp8kit import recipe as recipe_lib
from fp8kit.jax import _checks, _ffi, _ffi_grouped
from fp8kit.jax import _sharding as sh
from fp8kit.jax import _sharding_grouped as shg

_FN = "fp8kit.jax.grouped_dense"


@dataclasses.dataclass(frozen=True)
class _Config:
    """Everything static about one call (custom_vjp's nondiff arg)."""

    recipe: recipe_lib.CurrentScaling
    x_dtype: jnp.dtype
    kernel_dtype: jnp.dtype
    bias_dtype: Optional[jnp.dtype]
    # Sharding types (PartitionSpecs) of x, kernels, bias and y under
    # Explicit mesh axes, else None: the custom calls' results are typed
    # replicated and custom_vjp requires each cotangent to have its
    # primal's type.
    types: Optional[tuple[P, P, Optional[P], P]]

    def quantize(self, t, sizes, fmt: str, rowwise: bool, columnwise: bool):
        """(data, grouped columnwise copy, scale_inv) of t's current-scaling cast."""
        data, cw, _, scale_inv, _ = shg.grouped_quantize(
            t, sizes, fmt, rowwise, columnwise, self.recipe.amax_epsilon,
            self.recipe.power_2_scale)
        return data, cw, scale_inv

    def retype(self, *pairs):
        """Each array with its type (index into `types`), when typed."""
        if self.types is None:
            return tuple(x for x, _ in pairs)
        return tuple(None if x is None else sh.retype(x, self.types[i]) for x, i in pairs)


def _token_experts(group_sizes, tokens: int):
    """Each token's expert, [T] int32 (a count past T is cut off there)."""
    experts = jnp.arange(group_sizes.shape[0], dtype=jnp.int32)
    return jnp.repeat(experts, group_sizes, total_repeat_length=tokens)


def _forward(cfg: _Config, x, kernels, bias, group_sizes, grads: bool):
    (t, k), (e, _, n) = x.shape, kernels.shape
    fmt = cfg.recipe.fp8_format.forward_dtype
    sizes = _ffi_grouped.sizes_operand(group_sizes)
    x_d, x_cw, x_sinv = cfg.quantize(x, sizes, fmt, True, grads)
    kernel_sizes = _ffi_grouped.sizes_operand(jnp.full((e,), k, jnp.int32))
    k_d, k_cw, k_sinv = cfg.quantize(kernels.reshape(e * k, n), kernel_sizes, fmt, grads, True)
    # The GEMM epilogue adds a bias of the output's 16-bit type; a float32
    # output gets its bias added outside, in float32, as dense does.
    out = cfg.x_dtype
    fused = bias is not None and out != jnp.float32
    y = shg.grouped_gemm_tokens(x_d, x_sinv, k_cw[:e * n * k].reshape(e, n, k), k_sinv, sizes,
                                False, True, out, not cfg.recipe.forward_fast_accumulation,
                                bias.astype(out) if fused else None)
    if bias is not None and not fused:
        y = y + bias.astype(out)[_token_experts(group_sizes, t)]
    residuals = (x_cw, x_sinv, k_d.reshape(e, k, n) if grads else None, k_sinv, group_sizes)
    return cfg.retype((y, 3))[0], residuals


def _primal(cfg: _Config, x, kernels, bias, group_sizes):
    if x.shape[0] == 0:
        return jnp.zeros((0, kernels.shape[2]), cfg.x_dtype)
    return _forward(cfg, x, kernels, bias, group_sizes, grads=False)[0]


def _fwd(cfg: _Config, x, kernels, bias, group_sizes):
    if x.shape[0] == 0:  # no tokens: nothing to cast, zero gradients (x is empty)
        return _primal(cfg, x, kernels, bias, group_sizes), (x, group_sizes)
    return _forward(cfg, x, kernels, bias, group_sizes, grads=True)


def _bwd(cfg: _Config, res, dy):
    if len(res) == 2:  # T = 0
        (x, group_sizes), n = res, dy.shape[1]
        e, k = group_sizes.shape[0], x.shape[1]
        db = None if cfg.bias_dtype is None else jnp.zeros((e, n), cfg.bias_dtype)
        dx, dk = jnp.zeros((0, k), cfg.x_dtype), jnp.zeros((e, k, n), cfg.kernel_dtype)
        return (*cfg.retype((dx, 0), (dk, 1), (db, 2)), None)
    x_cw, x_sinv, k_d, k_sinv, group_sizes = res
    (t, n), (e, k, _) = dy.shape, k_d.shape
    if cfg.types is not None:  # typed as y; the grouped calls and the bias sums see all of it
        dy = sh.retype(dy, P())
    sizes = _ffi_grouped.sizes_operand(group_sizes)
    dq_d, dq_cw, dq_sinv = cfg.quantize(dy, sizes, cfg.recipe.fp8_format.backward_dtype,
                                        True, True)
    dx = shg.grouped_gemm_tokens(dq_d, dq_sinv, k_d, k_sinv, sizes, True, False, cfg.x_dtype,
                                 True)
    dk = shg.grouped_gemm_contract(x_cw, x_sinv, dq_cw, dq_sinv, sizes, t, k, n,
                                   cfg.kernel_dtype, True)
    db = None
    if cfg.bias_dtype is not None:
        db = jax.ops.segment_sum(dy.astype(jnp.float32), _token_experts(group_sizes, t),
                                 num_segments=e).astype(cfg.bias_dtype)
    return (*cfg.retype((dx, 0), (dk, 1), (db, 2)), None)


_grouped_dense = jax.custom_vjp(_primal, nondiff_argnums=(0,))
_grouped_dense.defvjp(_fwd, _bwd)


def grouped_dense(x, kernels, group_sizes, bias=None, *, recipe):
    """FP8 expert layer (see the module doc): y [T, N] in x's dtype,
    differentiable with respect to x, kernels and bias; jit- and vmap-able.

    x:           [T, K] float32/bfloat16/float16, the tokens sorted by expert.
    kernels:     [E, K, N] float32/bfloat16/float16 (gradient in its dtype);
                 K and N positive multiples of 16 (the FP8 GEMM alignment).
    group_sizes: int32 or int64 [E], each expert's token count, summing to T.
    bias:        [E, N] or None.
    recipe:      fp8kit.recipe.CurrentScaling.
    """
    _check_recipe(recipe)
    x, kernels = (_array(a, v) for a, v in (("x", x), ("kernels", kernels)))
    if x.ndim != 2:
        raise ValueError(f"{_FN}: x has shape {x.shape}; expected [T, K], the tokens sorted by "
                         "expert (reshape leading dims into T)")
    if kernels.ndim != 3:
        raise ValueError(f"{_FN}: kernels has shape {kernels.shape}; expected [E, K, N], one "
                         "[K, N] kernel per expert")
    e, k, n = kernels.shape
    if not 1 <= e <= _ffi_grouped.MAX_GROUPS:
        raise ValueError(f"{_FN}: kernels has shape {kernels.shape}; the grouped ops take 1 to "
                         f"{_ffi_grouped.MAX_GROUPS} experts")
    if x.shape[1] != k:
        raise ValueError(f"{_FN}: x has {x.shape[1]} features (shape {x.shape}) but kernels "
                         f"expect K={k} (shape {kernels.shape})")
    for name, dim in (("K", k), ("N", n)):
        if dim <= 0 or dim % _ffi.GEMM_DIM_MULTIPLE:
            raise ValueError(f"{_FN}: {name}={dim} must be a positive multiple of "
                             f"{_ffi.GEMM_DIM_MULTIPLE} (kernels has shape {kernels.shape}; "
                             "the FP8 GEMM's alignment, enforced on the CPU too); pad it")
    group_sizes = _check_group_sizes(group_sizes, e, x.shape[0])
    if bias is not None:
        bias = _array("bias", bias)
        if bias.shape != (e, n):
            raise ValueError(f"{_FN}: bias has shape {bias.shape}; expected ({e}, {n}), one "
                             "row per expert")
    types = None
    x_spec = sh.explicit_spec(x)
    if x_spec is not None:
        k_spec = sh.explicit_spec(kernels)
        rows, cols = sh.spec_axes(x_spec, 0), sh.spec_axes(k_spec, 2)
        y_spec = sh.spec_of([rows, () if set(rows) & set(cols) else cols])
        types = (x_spec, k_spec, None if bias is None else sh.explicit_spec(bias), y_spec)
    cfg = _Config(recipe=recipe, x_dtype=jnp.dtype(x.dtype), kernel_dtype=jnp.dtype(kernels.dtype),
                  bias_dtype=None if bias is None else jnp.dtype(bias.dtype), types=types)
    return _grouped_dense(cfg, x, kernels, bias, group_sizes)


def _check_recipe(recipe) -> None:
    if isinstance(recipe, recipe_lib.CurrentScaling):
        return
    if isinstance(recipe, (recipe_lib.DelayedScaling, recipe_lib.BlockScaling)):
        raise NotImplementedError(
            f"{_FN}: the recipe is {type(recipe).__name__}, but grouped_dense runs with "
            "fp8kit.recipe.CurrentScaling only so far (one scale per expert from its own amax); "
            "pass recipe=CurrentScaling()")
    raise TypeError(f"{_FN}: recipe must be fp8kit.recipe.CurrentScaling, got "
                    f"{type(recipe).__name__}")


def _array(arg: str, value):
    _checks.high_precision(_FN, arg, value)
    return jnp.asarray(value)


def _check_group_sizes(group_sizes, experts: int, tokens: int):
    """int32/int64 [E]; when concrete (not traced), >= 0 and summing to T."""
    dtype = getattr(group_sizes, "dtype", None)
    if dtype is None or jnp.dtype(dtype) not in (jnp.dtype(jnp.int32), jnp.dtype(jnp.int64)):
        raise TypeError(f"{_FN}: group_sizes has dtype {dtype}; pass the counts as an int32 or "
                        "int64 array")
    group_sizes = jnp.asarray(group_sizes)
    if group_sizes.shape != (experts,):
        raise ValueError(f"{_FN}: group_sizes has shape {group_sizes.shape} but kernels holds "
                         f"{experts} experts; pass one count per expert, shape ({experts},)")
    if not isinstance(group_sizes, jax.core.Tracer):
        counts = np.asarray(group_sizes)
        if (counts < 0).any() or counts.sum() != tokens:
            raise ValueError(f"{_FN}: group_sizes {counts.tolist()} sum to {counts.sum()} but x "
                             f"has {tokens} tokens; the counts must be >= 0 and sum to T")
    return group_sizes
