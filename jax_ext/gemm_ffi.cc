// FFI handler for fp8kit_gemm: D = op(A) op(B) with per-tensor or block
// scales, optional bias, D in bfloat16/float16/float32.
//
// Each FP8 operand arrives as up to two buffers: its rowwise data (2-D,
// [rows, cols]) and its columnwise data (the transpose, [cols, rows]); a
// buffer not held is an empty (0,) placeholder and flagged off by the
// *_rowwise / *_columnwise attributes. The core picks the layout its GEMM
// needs (TN canonicalization, fp8kit/gemm.h) and says which data is missing.
// Each operand's scale_inv is one float32 (per-tensor scaling) or, for a
// block-scaled operand (*_scaling_mode), the block scales of the one copy
// passed.
//
// Workspace: cuBLASLt's workspace is a second result of the custom call, a
// uint8 buffer XLA allocates with the program's other temporaries (sized by
// fp8kit.jax at trace time: fp8kit_gemm_workspace_size for the target
// platform, 0 for the CPU). Nothing is cudaMalloc'ed per call. XLA's FFI
// scratch allocator was the first choice, but under jax 0.11.2 on an H200
// it refused 32 MiB requests (RESOURCE_EXHAUSTED) even with memory free.
// An empty workspace result makes the core use its own per-stream
// workspace, allocated once.
#include <string>
#include <utility>

#include "ffi_helpers.h"
#include "handlers.h"

namespace fp8kit_jax {
namespace {

constexpr char kOp[] = "fp8kit_gemm";

// Descriptor of one FP8 operand from its rowwise and/or columnwise buffers.
ffi::ErrorOr<fp8kit_tensor> DescribeOperand(const Device& device, const char* name,
                                            ffi::AnyBuffer data, ffi::AnyBuffer columnwise,
                                            ffi::AnyBuffer scale_inv, bool has_rowwise,
                                            bool has_columnwise, int32_t scaling_mode) {
  const std::string arg(name);
  if (!has_rowwise && !has_columnwise) {
    return ffi::Unexpected(Invalid(kOp, arg + " holds neither rowwise nor columnwise data"));
  }
  const bool block = scaling_mode != FP8KIT_SCALING_PER_TENSOR;
  if (block && has_rowwise && has_columnwise) {
    return ffi::Unexpected(Invalid(kOp, arg + " is block-scaled and passes both copies; pass "
                                              "the one the GEMM reads, with its block scales"));
  }
  if (!block && (scale_inv.element_type() != ffi::DataType::F32 ||
                 scale_inv.element_count() != 1)) {
    return ffi::Unexpected(Invalid(kOp, arg + "'s scale_inv must hold exactly one float32"));
  }
  int64_t shape[2] = {0, 0};
  fp8kit_dtype dtype = FP8KIT_E4M3;
  if (has_rowwise) {
    auto d = data.dimensions();
    if (d.size() != 2) return ffi::Unexpected(Invalid(kOp, arg + "'s rowwise data must be 2-D"));
    shape[0] = d[0];
    shape[1] = d[1];
    if (!ToFp8kitDtype(data.element_type(), &dtype)) {
      return ffi::Unexpected(Invalid(kOp, arg + " has element type " +
                                              XlaTypeName(data.element_type())));
    }
  }
  if (has_columnwise) {
    auto d = columnwise.dimensions();
    if (d.size() != 2) return ffi::Unexpected(Invalid(kOp, arg + "'s columnwise data must be 2-D"));
    if (has_rowwise && (d[0] != shape[1] || d[1] != shape[0])) {
      return ffi::Unexpected(
          Invalid(kOp, arg + "'s columnwise data is not the transpose of its rowwise data"));
    }
    if (has_rowwise && columnwise.element_type() != data.element_type()) {
      return ffi::Unexpected(
          Invalid(kOp, arg + "'s rowwise and columnwise data have different FP8 types"));
    }
    shape[0] = d[1];
    shape[1] = d[0];
    if (!ToFp8kitDtype(columnwise.element_type(), &dtype)) {
      return ffi::Unexpected(Invalid(kOp, arg + " has element type " +
                                              XlaTypeName(columnwise.element_type())));
    }
  }
  fp8kit_tensor t = fp8kit_tensor_make(device.type, device.index, dtype, 2, shape,
                                       has_rowwise ? data.untyped_data() : nullptr);
  t.scaling_mode = static_cast<fp8kit_scaling_mode>(scaling_mode);
  t.columnwise_data = has_columnwise ? columnwise.untyped_data() : nullptr;
  if (!block) {
    t.scale_inv = static_cast<float*>(scale_inv.untyped_data());  // read only
    return t;
  }
  const std::string field = arg + "'s block scales";
  if (auto err = AttachBlockScales(kOp, field.c_str(), &t, has_columnwise, scale_inv);
      err.failure()) {
    return ffi::Unexpected(std::move(err));
  }
  return t;
}

ffi::Error GemmImpl(const Device& device, ffi::AnyBuffer a_data, ffi::AnyBuffer a_columnwise,
                    ffi::AnyBuffer a_scale_inv, ffi::AnyBuffer b_data,
                    ffi::AnyBuffer b_columnwise, ffi::AnyBuffer b_scale_inv,
                    ffi::AnyBuffer bias, ffi::Result<ffi::AnyBuffer> d,
                    ffi::Result<ffi::AnyBuffer> workspace, bool trans_a, bool trans_b,
                    bool a_rowwise, bool a_columnwise_held, bool b_rowwise, bool b_columnwise_held,
                    bool has_bias, bool use_split_accumulator, int32_t a_scaling_mode,
                    int32_t b_scaling_mode) {
  auto a = DescribeOperand(device, "A", a_data, a_columnwise, a_scale_inv, a_rowwise,
                           a_columnwise_held, a_scaling_mode);
  if (a.has_error()) return a.error();
  auto b = DescribeOperand(device, "B", b_data, b_columnwise, b_scale_inv, b_rowwise,
                           b_columnwise_held, b_scaling_mode);
  if (b.has_error()) return b.error();
  auto out = Describe(kOp, "D", *d, device);
  if (out.has_error()) return out.error();
  fp8kit_gemm_config config = fp8kit_gemm_config_default();
  config.trans_a = trans_a ? 1 : 0;
  config.trans_b = trans_b ? 1 : 0;
  config.use_split_accumulator = use_split_accumulator ? 1 : 0;
  if (has_bias) {
    fp8kit_dtype bias_dtype;
    if (!ToFp8kitDtype(bias.element_type(), &bias_dtype)) {
      return Invalid(kOp, "bias has element type " + XlaTypeName(bias.element_type()));
    }
    config.epilogue = FP8KIT_EPILOGUE_BIAS;
    config.bias = bias.untyped_data();
    config.bias_dtype = bias_dtype;
    config.bias_numel = static_cast<int64_t>(bias.element_count());
  }
  if (device.type == FP8KIT_DEVICE_CUDA && workspace->size_bytes() > 0) {
    config.workspace = workspace->untyped_data();
    config.workspace_bytes = workspace->size_bytes();
  }
  return FromStatus(fp8kit_gemm(&*a, &*b, &*out, &config, device.stream));
}

template <typename Binding>
auto BindGemm(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()          // a_data: A's rowwise FP8 data, 2-D (or (0,))
      .template Arg<ffi::AnyBuffer>()          // a_columnwise: A's transposed FP8 data (or (0,))
      .template Arg<ffi::AnyBuffer>()          // a_scale_inv: A's float32 scale_inv or block scales
      .template Arg<ffi::AnyBuffer>()          // b_data: B's rowwise FP8 data, 2-D (or (0,))
      .template Arg<ffi::AnyBuffer>()          // b_columnwise: B's transposed FP8 data (or (0,))
      .template Arg<ffi::AnyBuffer>()          // b_scale_inv: B's float32 scale_inv or block scales
      .template Arg<ffi::AnyBuffer>()          // bias: [N] (or (0,) without bias)
      .template Ret<ffi::AnyBuffer>()          // d: [M, N] bfloat16/float16/float32
      .template Ret<ffi::AnyBuffer>()          // workspace: uint8 cuBLASLt scratch ((0,) on CPU)
      .template Attr<bool>("trans_a")          // trans_a: A's rowwise data is [K, M]
      .template Attr<bool>("trans_b")          // trans_b: B's rowwise data is [N, K]
      .template Attr<bool>("a_rowwise")        // a_rowwise: a_data is held
      .template Attr<bool>("a_columnwise")     // a_columnwise: a_columnwise is held
      .template Attr<bool>("b_rowwise")        // b_rowwise: b_data is held
      .template Attr<bool>("b_columnwise")     // b_columnwise: b_columnwise is held
      .template Attr<bool>("has_bias")         // has_bias: add bias[N] in the epilogue
      .template Attr<bool>("use_split_accumulator")  // use_split_accumulator: FP32 promotion
      .template Attr<int32_t>("a_scaling_mode")  // a_scaling_mode: A's fp8kit_scaling_mode code
      .template Attr<int32_t>("b_scaling_mode");  // b_scaling_mode: B's fp8kit_scaling_mode code
}

}  // namespace
}  // namespace fp8kit_jax

FP8KIT_JAX_HANDLER_UNCAPTURED(gemm, fp8kit_jax::GemmImpl, fp8kit_jax::BindGemm);
