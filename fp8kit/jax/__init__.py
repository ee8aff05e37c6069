"""fp8kit's JAX front end: FP8 custom calls through XLA's FFI.

Importing this package registers fp8kit's FFI handlers with JAX (for the
"cpu" platform, and "CUDA" when fp8kit was built with CUDA).

    amax(x)                                   max |x| (float32)
    quantize(x, scale, fp8_dtype, rowwise, columnwise) -> ScaledTensor
    quantize_current_scaling(x, fp8_dtype, ...) -> (ScaledTensor, scale)
    compute_scale(amax, fp8_dtype, ...)       -> (scale, scale_inv)
    quantize_block_scaling(x, fp8_dtype, rowwise, columnwise, scaling_mode, ...)
                                              -> ScaledTensor with a scale per 1x128
                                              tile or 128x128 block
    dequantize(st, dtype, from_columnwise)
    cast_statistics(x, st, columnwise)        -> CastStatistics: what the cast of x
                                              into st lost (amax, underflow and
                                              saturation counts, error and signal
                                              sums of squares)
    statistics_rows(num_linears)              -> rows for a layer's `statistics`
                                              argument, whose gradient is then the
                                              statistics of the layer's casts
    tensor_statistics(rows, layer)            -> those as fp8kit.inspect TensorStats
    delayed_scaling_update(history, amax, scale, fp8_dtypes, margin, amax_reduction)
    gemm(a, b, trans_a, trans_b, out_dtype, bias)
    supports_non_tn_fp8_gemm(device), supports_block_scaled_fp8_gemm(device)
    dense(x, kernel, bias, *, state, recipe)  FP8 dense layer with custom_vjp
                                              (DelayedScaling, CurrentScaling, BlockScaling)
    DelayedScalingState.create(recipe)        its delayed-scaling state (from_arrays:
                                              one from its arrays, checked)
    layernorm_dense(x, gamma, beta, kernel, bias, *, normalization, state, recipe)
                                              norm + dense, the norm writing the FP8 input
    layernorm_mlp(x, gamma, beta, kernel_1, kernel_2, bias_1, bias_2, *,
                  normalization, activation, state, recipe)
                                              norm + dense + GELU/SwiGLU + dense, fused casts
                                              (state: DelayedScalingState.create(recipe,
                                              num_linears=2)); both fused layers take
                                              the three recipes, as dense does
    grouped_dense(x, kernels, group_sizes, bias, *, state, recipe)
                                              FP8 expert layer of a mixture of experts
                                              (jax.lax.ragged_dot's semantics, a scale
                                              per expert; the three recipes)
    GroupedDelayedScalingState.create(recipe, num_experts)
                                              its delayed-scaling state, one
                                              DelayedScalingState per expert
    expert_parallel.dispatch(x, expert, ...), expert_parallel.combine(y, plan)
                                              experts sharded over a mesh axis inside
                                              shard_map: the tokens to their experts'
                                              devices and back (all-to-all)

Sharding: under a mesh context (`with jax.set_mesh(mesh):`) the custom
calls are partitioned instead of gathered (data parallel, and tensor
parallel for dense and layernorm_mlp); see fp8kit/jax/_sharding.py. The
grouped calls of grouped_dense are gathered (_sharding_grouped.py);
expert parallelism is expert_parallel's dispatch and combine around
grouped_dense inside jax.shard_map.

Flax: fp8kit.jax.flax, imported on its own (it needs Flax), holds Dense,
LayerNormDense, LayerNormMLP and GroupedDense modules over these
functions, and registers DelayedScalingState and
GroupedDelayedScalingState with flax.serialization.

Modules, in import order (each imports only modules above it, so there
are no cycles; tests/jax/test_jax_imports.py checks it):

    _checks, scaled_tensor   argument checks; the ScaledTensor pytree
    _state_values            what a DelayedScalingState's values may be, and
                             the one-call-per-step rule on its use
    _ffi, _ffi_fused,        layer 1: the extension, its constants, and one
    _ffi_grouped             `*_call` wrapper per FFI target (jax.ffi.ffi_call);
                             _ffi_fused for the fused norm and activation ops,
                             _ffi_grouped for the grouped (expert) ops
    _sharding                the helpers every sharding rule shares
    _sharding_<family>       layer 2: custom_partitioning rules over _ffi,
                             one module per op family (quantize, block, gemm,
                             fused, grouped)
    _batching                the vmap rule of the fused delayed-scaling call
                             (a shared state records once per batch)
    block_quantization,      layer 3: the public functions (checks, then the
    quantization, matmul,    layer 2 call), one module per op family, each
    delayed_scaling,         named for its family and never for a function
    dense_layer, statistics  it exports (fp8kit.jax.gemm is the function)
    _linear, _mlp_fc1,       the steps of one Linear, of layernorm_mlp's fc1
    _fused_steps,            (SwiGLU's paired halves), and the fused norm and
    _fused_block_steps       activation casts (under BlockScaling: the core's
                             norm and activation without their cast, then a
                             block cast), which the layers share
    _sharding_fused_values   the sharding of those uncast calls
    fused_dense_layer,       layernorm_dense and layernorm_mlp
    fused_mlp_layer
    grouped_delayed_scaling  GroupedDelayedScalingState and its grouped cast
    _grouped_block           grouped_dense's BlockScaling steps (padded rows)
    grouped_dense_layer      grouped_dense
    expert_parallel          dispatch and combine around grouped_dense (jax only)
"""

from fp8kit.jax._ffi import BUILT_WITH_CUDA
from fp8kit.jax.delayed_scaling import DelayedScalingState, delayed_scaling_update
from fp8kit.jax.dense_layer import dense
from fp8kit.jax.fused_dense_layer import layernorm_dense
from fp8kit.jax.fused_mlp_layer import layernorm_mlp
from fp8kit.jax.grouped_dense_layer import grouped_dense
from fp8kit.jax.grouped_delayed_scaling import GroupedDelayedScalingState
from fp8kit.jax import expert_parallel
from fp8kit.jax.block_quantization import quantize_block_scaling
from fp8kit.jax.matmul import gemm, supports_block_scaled_fp8_gemm, supports_non_tn_fp8_gemm
from fp8kit.jax.quantization import (amax, compute_scale, dequantize, quantize,
                                     quantize_current_scaling)
from fp8kit.jax.scaled_tensor import ScaledTensor
from fp8kit.jax.statistics import (CastStatistics, cast_statistics, statistics_rows,
                                   tensor_statistics)

__all__ = [
    "BUILT_WITH_CUDA", "CastStatistics", "DelayedScalingState", "GroupedDelayedScalingState",
    "ScaledTensor", "amax", "expert_parallel",
    "cast_statistics", "compute_scale", "delayed_scaling_update", "dense", "dequantize", "gemm",
    "grouped_dense", "layernorm_dense", "layernorm_mlp", "quantize", "quantize_block_scaling",
    "quantize_current_scaling", "statistics_rows", "supports_block_scaled_fp8_gemm",
    "supports_non_tn_fp8_gemm", "tensor_statistics",
]
