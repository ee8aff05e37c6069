// Block-scaled FP8 on torch tensors (fp8kit/block_scaling.h): quantization
// with one float32 scale per 1x128 tile or 128x128 block, dequantization and
// the block-scaled GEMM. Two glues call these functions, as for ops.h: the
// pybind11 functions registered here (wrapped by fp8kit.torch.block_ops) and
// the dispatcher ops torch.ops.fp8kit.* (block_dispatcher_ops.cc).
//
// A scaling mode is named in Python as the C enum without its prefix:
// "block_1x128" (FP8KIT_SCALING_BLOCK_1X128) or "block_128x128". Block
// scales are float32 [outer, inner] tensors in the layout cuBLASLt reads
// (fp8kit_block_scale_inv_shape), one per stored copy.
#ifndef FP8KIT_TORCH_EXT_BLOCK_OPS_H_
#define FP8KIT_TORCH_EXT_BLOCK_OPS_H_

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "torch_includes.h"

namespace fp8kit_torch {

using OptTensor = std::optional<at::Tensor>;

// "block_1x128" / "block_128x128" -> the scaling mode; ValueError naming
// `arg` otherwise.
fp8kit_scaling_mode parse_block_mode(const std::string& name, const char* fn, const char* arg);
const char* block_mode_name(fp8kit_scaling_mode mode);

// [outer, inner] of the block scales of a tensor of logical `shape` (rowwise
// copy, or the columnwise one).
std::vector<int64_t> block_scale_inv_shape(at::IntArrayRef shape, fp8kit_scaling_mode mode,
                                           bool columnwise);

// Checks that `s` is the float32 block scales of shape `want` (the core
// reads exactly that many floats), contiguous, on ref's device.
void check_block_scales(const char* fn, const char* arg, const at::Tensor& s,
                        const std::vector<int64_t>& want, const char* ref_arg,
                        const at::Tensor& ref);

// The buffers of one block-scaled quantization (undefined: not held).
struct BlockBuffers {
  at::Tensor data, block_scale_inv, columnwise_data, columnwise_block_scale_inv;
};

// New buffers for contiguous high-precision x (the copies asked for).
BlockBuffers alloc_block_buffers(const at::Tensor& x, fp8kit_dtype fp8, fp8kit_scaling_mode mode,
                                 bool rowwise, bool columnwise);

// Checks that `b` holds FP8 `fp8` copies and block scales of the shapes a
// tensor of `shape` quantized with `mode` has, contiguous, on src's device
// (the existing buffers an in-place re-quantization writes into).
void check_block_buffers(const char* fn, const BlockBuffers& b, at::IntArrayRef shape,
                         fp8kit_dtype fp8, fp8kit_scaling_mode mode, const at::Tensor& src);

// One fp8kit_quantize_block_scaling call: contiguous checked x into `out`.
void quantize_block_into(const at::Tensor& x, fp8kit_dtype fp8, fp8kit_scaling_mode mode,
                         const BlockBuffers& out, double amax_epsilon, bool power_2_scale);

// Quantizes x: (data, block_scale_inv, columnwise_data,
// columnwise_block_scale_inv), each nullopt when its copy is not asked for.
std::tuple<OptTensor, OptTensor, OptTensor, OptTensor> quantize_block(
    const char* fn, const at::Tensor& x, fp8kit_dtype fp8, fp8kit_scaling_mode mode,
    bool rowwise, bool columnwise, double amax_epsilon, bool power_2_scale);

// The high-precision tensor of logical `shape` from one stored copy (the
// rowwise copy, or the columnwise one with from_columnwise) and its scales.
at::Tensor dequantize_block(const char* fn, const at::Tensor& data,
                            const at::Tensor& block_scale_inv, fp8kit_scaling_mode mode,
                            at::ScalarType out_dtype, bool from_columnwise,
                            const std::optional<std::vector<int64_t>>& shape);

// One block-scaled GEMM operand: rowwise and/or columnwise copy of a 2-D
// tensor, each with its block scales.
struct BlockOperand {
  OptTensor data, block_scale_inv, columnwise_data, columnwise_block_scale_inv;
  fp8kit_scaling_mode mode;
};

// D = op(A) @ op(B) (+ bias) (+ D's old contents when accumulate) into a
// new [m, n] tensor of out_dtype (bfloat16 or float32) or into `out`.
at::Tensor gemm_block(const char* fn, const BlockOperand& a, const BlockOperand& b, bool trans_a,
                      bool trans_b, at::ScalarType out_dtype, const OptTensor& bias,
                      bool accumulate, const OptTensor& out);

// The core's cached answer for `device` (a CUDA device without an index:
// the current one).
bool supports_block_scaled_fp8_gemm(const char* fn, const at::Device& device);

// Binds the functions above into fp8kit._torch_ext.
void register_block_ops(pybind11::module_& m);

}  // namespace fp8kit_torch

#endif  // FP8KIT_TORCH_EXT_BLOCK_OPS_H_
