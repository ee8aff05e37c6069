"""fp8kit's PyTorch front end.

Functional ops (fp8kit.torch.ops): amax, quantize, quantize_current_scaling,
dequantize, columnwise_from_rowwise, delayed_scaling_update, gemm,
supports_non_tn_fp8_gemm;
block-scaled (fp8kit.torch.block_ops): quantize_block, dequantize_block,
gemm_block, block_scale_inv_shape, supports_block_scaled_fp8_gemm; and
cast_statistics(x, quantized) (fp8kit.torch.statistics): what a cast of x
into a Float8Tensor or Float8BlockTensor lost, as a CastStatistics.
Quantizers (C++): Float8Quantizer (delayed scaling),
Float8CurrentScalingQuantizer; calling one returns a Float8Tensor.
Float8BlockQuantizer (a scale per 1x128 tile or 128x128 block) returns a
Float8BlockTensor. Tensors: QuantizedTensor, Float8Tensor,
Float8BlockTensor. Modules: Linear and the fused LayerNormLinear and
LayerNormMLP, used inside autocast(recipe=...) with DelayedScaling,
CurrentScaling or BlockScaling; GroupedLinear, the experts of a mixture of
experts (CurrentScaling). inspect(model, every=N, log=path)
(fp8kit.torch.inspection): the cast statistics of every FP8 GEMM operand
of a model's fp8kit layers, logged every N training steps.
Dispatcher ops (torch.ops.fp8kit.*, what torch.compile traces): see
fp8kit.torch.ops, fp8kit.torch.block_ops and fp8kit.torch.statistics.
"""

from fp8kit.recipe import (AmaxReduction, BlockScaling, CurrentScaling,  # noqa: F401
                           DelayedScaling, Format)
# Imported for what they register: the fake kernels of torch.ops.fp8kit.*,
# and Float8Tensor's op table (float8_tensor_ops imports float8_tensor, so
# the package imports the table rather than float8_tensor).
from fp8kit.torch import _block_fake_ops, _fake_ops, _grouped_block_fake_ops  # noqa: F401
from fp8kit.torch import _grouped_fake_ops  # noqa: F401
from fp8kit.torch import float8_tensor_ops  # noqa: F401
from fp8kit.torch.autocast import autocast, current_recipe
from fp8kit.torch.block_ops import (block_scale_inv_shape, dequantize_block, gemm_block,
                                    quantize_block, supports_block_scaled_fp8_gemm)
from fp8kit.torch.float8_block_tensor import Float8BlockTensor
from fp8kit.torch.float8_tensor import Float8Tensor
from fp8kit.torch.grouped_linear import GroupedLinear
from fp8kit.torch.inspection import Inspection, inspect
from fp8kit.torch.layernorm_linear import LayerNormLinear
from fp8kit.torch.layernorm_mlp import LayerNormMLP
from fp8kit.torch.linear import Linear
from fp8kit.torch.ops import (amax, built_with_cuda, columnwise_from_rowwise,
                              delayed_scaling_update, dequantize, gemm, quantize,
                              quantize_current_scaling, supports_non_tn_fp8_gemm)
from fp8kit.torch.quantized_tensor import QuantizedTensor
from fp8kit.torch.quantizers import (Float8BlockQuantizer, Float8CurrentScalingQuantizer,
                                     Float8Quantizer, Quantizer, quantizer_for)
from fp8kit.torch.statistics import CastStatistics, cast_statistics

__all__ = [
    "amax", "quantize", "quantize_current_scaling", "dequantize", "columnwise_from_rowwise",
    "delayed_scaling_update",
    "gemm", "supports_non_tn_fp8_gemm", "built_with_cuda", "Quantizer", "Float8Quantizer",
    "Float8CurrentScalingQuantizer", "quantizer_for", "QuantizedTensor", "Float8Tensor",
    "Linear", "LayerNormLinear", "LayerNormMLP", "GroupedLinear", "autocast", "current_recipe", "DelayedScaling",
    "CurrentScaling", "Format", "AmaxReduction", "BlockScaling", "quantize_block",
    "dequantize_block", "gemm_block", "block_scale_inv_shape", "supports_block_scaled_fp8_gemm",
    "Float8BlockQuantizer", "Float8BlockTensor", "cast_statistics", "CastStatistics",
    "Inspection",
]
# fp8kit.torch.inspect stays out of __all__: a star import would shadow the
# standard library's inspect module in the importer's namespace.


def _allow_in_weights_only_load():
    # Checkpoints holding Float8Tensors, Float8BlockTensors or their
    # quantizers load with torch.load(weights_only=True): these are plain
    # data containers.
    import torch.serialization as s
    from fp8kit.torch.float8_block_tensor import _rebuild_float8_block_tensor
    from fp8kit.torch.float8_tensor import _rebuild_float8_tensor
    if hasattr(s, "add_safe_globals"):
        s.add_safe_globals([_rebuild_float8_tensor, Float8Quantizer,
                            Float8CurrentScalingQuantizer, _rebuild_float8_block_tensor,
                            Float8BlockQuantizer])


_allow_in_weights_only_load()
