"""fp8kit's JAX front end: FP8 custom calls through XLA's FFI.

Importing this package registers fp8kit's FFI handlers with JAX (for the
"cpu" platform, and "CUDA" when fp8kit was built with CUDA).

    amax(x)                                   max |x| (float32)
    quantize(x, scale, fp8_dtype, rowwise, columnwise) -> ScaledTensor
    quantize_current_scaling(x, fp8_dtype, ...) -> (ScaledTensor, scale)
    compute_scale(amax, fp8_dtype, ...)       -> (scale, scale_inv)
    dequantize(st, dtype, from_columnwise)
    delayed_scaling_update(history, amax, scale, fp8_dtypes, margin, reduction)
    gemm(a, b, trans_a, trans_b, out_dtype, bias)
    supports_non_tn_fp8_gemm(device)
    dense(x, kernel, bias, *, state, recipe)  FP8 dense layer with custom_vjp
    DelayedScalingState.create(recipe)        its delayed-scaling state

Sharding: under a mesh context (`with jax.set_mesh(mesh):`) the custom
calls are partitioned instead of gathered; see fp8kit/jax/partitioning.py.
"""

from fp8kit.jax._registry import BUILT_WITH_CUDA  # noqa: F401
from fp8kit.jax.amax_op import amax
from fp8kit.jax.delayed_scaling import delayed_scaling_update
from fp8kit.jax.dense_layer import dense
from fp8kit.jax.gemm_op import gemm, supports_non_tn_fp8_gemm
from fp8kit.jax.quantization import compute_scale, dequantize, quantize, quantize_current_scaling
from fp8kit.jax.scaled_tensor import ScaledTensor
from fp8kit.jax.state import DelayedScalingState

__all__ = [
    "BUILT_WITH_CUDA", "DelayedScalingState", "ScaledTensor", "amax", "compute_scale",
    "delayed_scaling_update", "dense", "dequantize", "gemm", "quantize",
    "quantize_current_scaling", "supports_non_tn_fp8_gemm",
]
