"""fp8kit.jax.grouped_dense: the expert layer of a mixture of experts, E
dense layers each applied to its own group of tokens, with FP8 GEMMs; the
semantics of jax.lax.ragged_dot (plus a bias per expert):

    y = grouped_dense(x, kernels, group_sizes, bias, recipe=CurrentScaling())
    y = grouped_dense(x, kernels, group_sizes, bias, state=state, recipe=DelayedScaling())
    y[t] = x[t] @ kernels[e] + bias[e]    for the expert e token t belongs to

x [T, K] holds the tokens of expert 0, then those of expert 1, and so on
(contiguous layout); group_sizes (int32 or int64 [E], zero allowed) counts
each expert's tokens and must sum to T. kernels [E, K, N], bias [E, N].

Under CurrentScaling every operand has one scale per expert, from that
expert's own amax (its tokens of x and of the output gradient, its kernel
matrix), so each expert's values are bit for bit those of fp8kit.jax.dense
on its tokens alone. Under DelayedScaling each expert has its own scaling
state (a GroupedDelayedScalingState, fp8kit/jax/grouped_delayed_scaling.py),
seeded and recorded as dense's, and updated through the state argument's
cotangent as dense's is: again each expert's values are dense's with that
expert's state, except that an expert with no tokens in a step casts (and
records) no output gradient. Under BlockScaling the tokens are laid out
padded per expert (fp8kit/jax/_grouped_block.py) and each expert is cast
1x128 / 128x128 and multiplied as dense does it. The casts of all experts
are one custom call per tensor, the GEMMs one per pass
(common/include/fp8kit/grouped.h):

Forward:  y_e  = Q(x_e) @ Q(kernel_e)          grouped GEMM over tokens
Backward: dx_e = Q(dy_e) @ Q(kernel_e)^T        grouped GEMM over tokens
          dk_e = Q(x_e)^T @ Q(dy_e)             grouped GEMM contracting each
                                                expert's tokens (zero for an
                                                expert with none)
          db_e = the sum of dy_e, in float32    (_bias_grad: a GEMM with the
                                                tokens' one-hot experts)

The kernels are cast as one token-grouped [E * K, N] tensor of E groups of
K rows: its rowwise copy is [E, K, N] (what dgrad reads) and its grouped
columnwise copy begins with each expert's transpose [N, K] back to back (K
is a multiple of 16, so no group is padded), which the forward GEMM reads
K-contiguous, from the flat buffer as it is (a slice of it would be a copy).
Backward keeps x and the kernels in FP8 only.

The core reads the group sizes on the host (on a GPU: a copy and a wait
for the stream per grouped call), so these calls are never captured into
XLA's CUDA graphs. Counts that do not sum to T are a ValueError when they
are concrete; under jit the core refuses them when the program runs (an
XLA runtime error naming group_sizes). Under a mesh the grouped calls are
gathered and run whole on every device (fp8kit/jax/_sharding_grouped.py
says why).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from fp8kit import recipe as recipe_lib
from fp8kit.jax import _checks, _ffi, _ffi_grouped, _grouped_block
from fp8kit.jax import _grouped_statistics as gstats
from fp8kit.jax import _sharding as sh
from fp8kit.jax import _statistics_rows as stats_rows
from fp8kit.jax import _sharding_grouped as shg
from fp8kit.jax import grouped_delayed_scaling as gds
from fp8kit.jax.delayed_scaling import GRAD_OUTPUT, INPUT, WEIGHT, note_use

_FN = "fp8kit.jax.grouped_dense"


@dataclasses.dataclass(frozen=True)
class _Config:
    """Everything static about one call (custom_vjp's nondiff arg)."""

    recipe: recipe_lib.CurrentScaling | recipe_lib.DelayedScaling | recipe_lib.BlockScaling
    x_dtype: jnp.dtype
    kernel_dtype: jnp.dtype
    bias_dtype: Optional[jnp.dtype]
    # Sharding types (PartitionSpecs) of x, kernels, bias, y and the state's
    # leaves under Explicit mesh axes, else None: the custom calls' results
    # are typed replicated and custom_vjp requires each cotangent to have
    # its primal's type.
    types: Optional[tuple[P, P, Optional[P], P, Optional[tuple[P, ...]]]]
    # The manual mesh axes (inside jax.shard_map) that x, kernels, bias, y
    # (those of x and kernels) and the state's leaves vary over, indexed as
    # `types`: each result and cotangent is made to vary as its primal does.
    varying: tuple[frozenset, frozenset, frozenset, frozenset, tuple[frozenset, ...]] = (
        frozenset(), frozenset(), frozenset(), frozenset(), ())

    @property
    def delayed(self) -> bool:
        return isinstance(self.recipe, recipe_lib.DelayedScaling)

    @property
    def block(self) -> bool:
        return isinstance(self.recipe, recipe_lib.BlockScaling)

    def quantize(self, t, sizes, fmt: str, copies, state, slot: int, record: bool, used=None):
        """(state, data, grouped columnwise copy, scale_inv) of t's per-tensor
        cast: current scaling, or delayed with the state's `slot` (recorded
        when `record`, except for the experts `used` excludes)."""
        if self.delayed:
            return gds.quantize_and_record(state, self.recipe, slot, t, sizes, fmt, copies,
                                           record, used)
        data, cw, _, scale_inv, _ = shg.grouped_quantize(
            t, sizes, fmt, *copies, self.recipe.amax_epsilon, self.recipe.power_2_scale)
        return state, data, cw, scale_inv

    def retype(self, *pairs):
        """Each array with its type (index into `types`), when typed, and
        varying over the manual axes its primal varies over."""
        pairs = tuple((sh.vary_like(x, self.varying[i]), i) for x, i in pairs)
        if self.types is None:
            return tuple(x for x, _ in pairs)
        return tuple(None if x is None else sh.retype(x, self.types[i]) for x, i in pairs)

    def retype_state(self, state):
        if state is None:
            return state
        leaves, tree = jax.tree_util.tree_flatten(state)
        if self.varying[4]:
            leaves = list(map(sh.vary_like, leaves, self.varying[4]))
        if self.types is not None:
            leaves = list(map(sh.retype, leaves, self.types[4]))
        return tree.unflatten(leaves)


def _token_experts(group_sizes, tokens: int):
    """Each token's expert, [T] int32 (a count past T is cut off there)."""
    experts = jnp.arange(group_sizes.shape[0], dtype=jnp.int32)
    return jnp.repeat(experts, group_sizes, total_repeat_length=tokens)


def _bias_grad(dy, group_sizes, tokens: int):
    """Each expert's float32 sum of its rows of dy [T, N], [E, N]: a GEMM of
    the tokens' one-hot experts (exact in dy's dtype) with dy, accumulated
    in float32, which gives the same bits on every run; jax.ops.segment_sum
    is a scatter-add, with float atomics on a GPU."""
    experts = jax.nn.one_hot(_token_experts(group_sizes, tokens), group_sizes.shape[0],
                             dtype=dy.dtype)
    return jax.lax.dot_general(experts, dy, (((0,), (0,)), ((), ())),
                               precision=jax.lax.Precision.HIGHEST,
                               preferred_element_type=jnp.float32)


def _forward(cfg: _Config, x, kernels, bias, group_sizes, state, grads: bool, stats=None):
    """(y, state, what backward reads, stats); differentiating, a delayed
    state records x and the kernels, and statistics rows (stats) their
    casts' statistics."""
    (t, k), (e, _, n) = x.shape, kernels.shape
    if t == 0 and not cfg.delayed:  # no tokens: nothing to cast (x is empty)
        return jnp.zeros((0, n), cfg.x_dtype), state, (x,), stats
    if cfg.block:
        if cfg.types is not None:  # scattered into the padded rows, which the calls see whole
            x = sh.retype(x, P())
        y, saved, stats = _grouped_block.forward(cfg, x, kernels, bias, group_sizes,
                                                 _token_experts(group_sizes, t), grads, stats)
        return cfg.retype((y, 3))[0], state, saved, stats
    fmt = cfg.recipe.fp8_format.forward_dtype
    sizes = _ffi_grouped.sizes_operand(group_sizes)
    state, x_d, x_cw, x_sinv = cfg.quantize(x, sizes, fmt, (True, grads), state, INPUT, grads)
    stats = gstats.per_tensor(stats, INPUT, x, x_d, x_sinv, _token_experts(group_sizes, t), t * k)
    kernel_sizes = _ffi_grouped.sizes_operand(jnp.full((e,), k, jnp.int32))
    k_2d = kernels.reshape(e * k, n)
    state, k_d, k_cw, k_sinv = cfg.quantize(k_2d, kernel_sizes, fmt,
                                            (grads or stats is not None, True), state, WEIGHT,
                                            grads)
    stats = gstats.per_tensor(stats, WEIGHT, k_2d, k_d, k_sinv,
                              jnp.repeat(jnp.arange(e, dtype=jnp.int32), k), e * k * n)
    if t == 0:  # delayed: the casts above recorded, nothing to multiply
        return jnp.zeros((0, n), cfg.x_dtype), state, (x,), stats
    # The GEMM epilogue adds a bias of the output's 16-bit type; a float32
    # output gets its bias added outside, in float32, as dense does.
    out = cfg.x_dtype
    fused = bias is not None and out != jnp.float32
    # The kernels' flat grouped columnwise copy is read whole: a slice of
    # it would be an FP8 copy of every kernel in the program.
    y = shg.grouped_gemm_tokens(x_d, x_sinv, k_cw, k_sinv, sizes, False, True, out,
                                not cfg.recipe.forward_fast_accumulation, (k, n),
                                bias.astype(out) if fused else None)
    if bias is not None and not fused:
        y = y + bias.astype(out)[_token_experts(group_sizes, t)]
    saved = (x_cw, x_sinv, k_d.reshape(e, k, n), k_sinv) if grads else None
    return cfg.retype((y, 3))[0], state, saved, stats


def _primal(cfg: _Config, x, kernels, bias, group_sizes, state, stats):
    return _forward(cfg, x, kernels, bias, group_sizes, state, grads=False)[0]


def _fwd(cfg: _Config, x, kernels, bias, group_sizes, state, stats):
    y, state, saved, stats = _forward(cfg, x, kernels, bias, group_sizes, state, True, stats)
    # The forward's updated state (and statistics) travel to the backward,
    # which records dy; both leave as their cotangents.
    return y, (saved, group_sizes, state, stats)


def _bwd(cfg: _Config, res, dy):
    saved, group_sizes, state, stats = res
    (t, n), e = dy.shape, group_sizes.shape[0]
    if t == 0:  # zero gradients; no expert casts an output gradient
        k = saved[0].shape[1]
        db = None if cfg.bias_dtype is None else jnp.zeros((e, n), cfg.bias_dtype)
        dx, dk = jnp.zeros((0, k), cfg.x_dtype), jnp.zeros((e, k, n), cfg.kernel_dtype)
        return (*cfg.retype((dx, 0), (dk, 1), (db, 2)), None, cfg.retype_state(state), stats)
    if cfg.types is not None:  # typed as y; the grouped calls and the bias sums see all of it
        dy = sh.retype(dy, P())
    if cfg.block:
        dx, dk, stats = _grouped_block.backward(cfg, saved, group_sizes, dy, stats)
    else:
        x_cw, x_sinv, k_d, k_sinv = saved
        k = k_d.shape[1]
        sizes = _ffi_grouped.sizes_operand(group_sizes)
        # An expert with no tokens records nothing here, as a dense layer
        # given no tokens would cast no output gradient (fp8kit.torch's rule).
        state, dq_d, dq_cw, dq_sinv = cfg.quantize(dy, sizes, cfg.recipe.fp8_format.backward_dtype,
                                                   (True, True), state, GRAD_OUTPUT, True,
                                                   used=group_sizes > 0)
        stats = gstats.per_tensor(stats, GRAD_OUTPUT, dy, dq_d, dq_sinv,
                                  _token_experts(group_sizes, t), t * n)
        dx = shg.grouped_gemm_tokens(dq_d, dq_sinv, k_d, k_sinv, sizes, True, False, cfg.x_dtype,
                                     True, (k, n))
        dk = shg.grouped_gemm_contract(x_cw, x_sinv, dq_cw, dq_sinv, sizes, t, k, n,
                                       cfg.kernel_dtype, True)
    db = None
    if cfg.bias_dtype is not None:
        db = _bias_grad(dy, group_sizes, t).astype(cfg.bias_dtype)
    return (*cfg.retype((dx, 0), (dk, 1), (db, 2)), None, cfg.retype_state(state), stats)


_grouped_dense = jax.custom_vjp(_primal, nondiff_argnums=(0,))
_grouped_dense.defvjp(_fwd, _bwd)


def grouped_dense(x, kernels, group_sizes, bias=None, *,
                  state: Optional[gds.GroupedDelayedScalingState] = None, recipe,
                  statistics=None):
    """FP8 expert layer (see the module doc): y [T, N] in x's dtype,
    differentiable with respect to x, kernels and bias; jit- and vmap-able.

    x:           [T, K] float32/bfloat16/float16, the tokens sorted by expert.
    kernels:     [E, K, N] float32/bfloat16/float16 (gradient in its dtype);
                 K and N positive multiples of 16 (the FP8 GEMM alignment).
    group_sizes: int32 or int64 [E], each expert's token count, summing to T.
    bias:        [E, N] or None.
    recipe:      fp8kit.recipe.CurrentScaling, DelayedScaling (then `state`
                 is required: a GroupedDelayedScalingState.create(recipe, E),
                 updated through its cotangent) or BlockScaling (no state;
                 block-scaled GEMMs need supports_block_scaled_fp8_gemm).
    statistics:  None, or fp8kit.jax.statistics_rows(1): then the gradient
                 with respect to it is the cast statistics of x, the kernels
                 and the output gradient, each merged over the experts (amax
                 the largest, counts and sums added; no one scale, NaN), as
                 dense's (fp8kit.jax.tensor_statistics reads them). Under a
                 mesh they are the whole layer's (the statistics calls read
                 gathered operands); not inside jax.shard_map yet.
    """
    _check_recipe(recipe, state)
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
    if state is not None:
        gds.check_state(_FN, recipe, state, e)
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
        state_specs = None if state is None else tuple(
            sh.explicit_spec(a) for a in jax.tree_util.tree_leaves(state))
        types = (x_spec, k_spec, None if bias is None else sh.explicit_spec(bias), y_spec,
                 state_specs)
    x_axes, k_axes = sh.varying_axes(x), sh.varying_axes(kernels)
    varying = (x_axes, k_axes, sh.varying_axes(bias), x_axes | k_axes,
               tuple(map(sh.varying_axes, jax.tree_util.tree_leaves(state))))
    statistics = stats_rows.check(_FN, statistics, 1)
    if statistics is not None and any(varying[:4]):
        raise ValueError(f"{_FN}: statistics are not collected inside jax.shard_map (each "
                         "device would see its own experts' casts only) yet; pass "
                         "statistics=None there, or collect them from a step sharded by a mesh "
                         "outside shard_map, where they are the whole layer's")
    cfg = _Config(recipe=recipe, x_dtype=jnp.dtype(x.dtype), kernel_dtype=jnp.dtype(kernels.dtype),
                  bias_dtype=None if bias is None else jnp.dtype(bias.dtype), types=types,
                  varying=varying)
    note_use(_FN, state)
    return _grouped_dense(cfg, x, kernels, bias, group_sizes, state, statistics)


def _check_recipe(recipe, state) -> None:
    """A DelayedScaling recipe with a state (checked once E is known), or a
    stateless recipe with none."""
    if isinstance(recipe, recipe_lib.DelayedScaling):
        if state is None:
            raise TypeError(f"{_FN}: a DelayedScaling recipe needs state=GroupedDelayedScaling"
                            "State.create(recipe, num_experts), one scaling state per expert")
    elif isinstance(recipe, (recipe_lib.CurrentScaling, recipe_lib.BlockScaling)):
        if state is not None:
            raise TypeError(f"{_FN}: {type(recipe).__name__} is stateless; pass state=None")
    else:
        raise TypeError(f"{_FN}: recipe must be fp8kit.recipe.DelayedScaling, CurrentScaling "
                        f"or BlockScaling, got {type(recipe).__name__}")


def _array(arg: str, value):
    _checks.high_precision(_FN, arg, value)
    return jnp.asarray(value)


def _check_group_sizes(group_sizes, experts: int, tokens: int):
    """int32/int64 [E]; when concrete (not traced), >= 0 and summing to T."""
    dtype = getattr(group_sizes, "dtype", None)
    if dtype is None:
        raise TypeError(f"{_FN}: group_sizes is a {type(group_sizes).__name__}; pass the counts "
                        "as an int32 or int64 array, e.g. jnp.asarray(counts, jnp.int32)")
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.int32), jnp.dtype(jnp.int64)):
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
