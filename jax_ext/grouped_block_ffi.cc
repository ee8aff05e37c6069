// FFI handlers for the block-scaled grouped ops (fp8kit/grouped.h, "Block
// scaling over groups"), for fp8kit.jax.grouped_dense under BlockScaling:
//   fp8kit_grouped_quantize_block      1x128 or 128x128 cast of a grouped
//                                      tensor in the padded row layout
//   fp8kit_grouped_gemm_block_tokens   D [rows, N] = A_g @ op(B_g) per group
//                                      over its padded rows
//   fp8kit_grouped_gemm_block_contract D [E, M, N] = A_g^T @ B_g per group
//                                      over its padded tokens
//
// Token-grouped buffers are in the padded row layout: `rows` rows (at least
// the sum of the padded group sizes), group g's at its padded offset. A
// copy's block scales are one flat float32 buffer of
// fp8kit_grouped_block_scales_floats floats, the groups' one after another;
// an expert-stacked operand [E, R, C] holds E single-matrix scale arrays.
// The copy not asked for (or not read) is an empty (0,) placeholder. Group
// sizes arrive as in grouped_ffi.cc, and like those handlers these are
// uncaptured.
#include <string>
#include <utility>

#include "ffi_helpers.h"
#include "fp8kit/block_scaling.h"
#include "fp8kit/grouped.h"
#include "grouped_ffi.h"
#include "handlers.h"

namespace fp8kit_jax {
namespace {

fp8kit_scaling_mode Mode(int32_t code) { return static_cast<fp8kit_scaling_mode>(code); }

bool IsBlockMode(int32_t code) {
  return Mode(code) == FP8KIT_SCALING_BLOCK_1X128 || Mode(code) == FP8KIT_SCALING_BLOCK_128X128;
}

// Points t's copy (columnwise or not) at `scales` after checking that it
// is float32 with exactly `floats` elements: the core trusts the pointer.
ffi::Error AttachScales(const char* op, const char* arg, ffi::AnyBuffer scales, int64_t floats,
                        bool columnwise, fp8kit_tensor* t) {
  if (scales.element_type() != ffi::DataType::F32 ||
      NumElements(scales.dimensions()) != floats) {
    return Invalid(op, std::string(arg) + " must be float32 with " + std::to_string(floats) +
                           " elements, got " + XlaTypeName(scales.element_type()) + " with " +
                           std::to_string(NumElements(scales.dimensions())));
  }
  float* p = static_cast<float*>(scales.untyped_data());
  (columnwise ? t->columnwise_block_scale_inv : t->block_scale_inv) = p;
  return ffi::Error::Success();
}

// The block scales of a grouped copy of [rows, features] (`mode` a code).
int64_t GroupedFloats(int64_t rows, int64_t groups, int64_t features, int32_t mode,
                      bool columnwise) {
  return fp8kit_grouped_block_scales_floats(rows, groups, features, Mode(mode),
                                            columnwise ? 1 : 0);
}

// An FP8 operand's descriptor with no data yet: `shape` (rank 2 or 3), the
// type of `buf`, block scaling `mode`.
ffi::ErrorOr<fp8kit_tensor> Operand(const char* op, const char* arg, ffi::AnyBuffer buf,
                                    int32_t mode, const Device& device, int rank,
                                    const int64_t* shape) {
  if (!IsBlockMode(mode)) {
    return ffi::Unexpected(Invalid(op, std::string(arg) + "'s scaling_mode must be a block "
                                                          "mode (1x128 or 128x128)"));
  }
  auto dtype = GroupFp8Type(op, arg, buf);
  if (dtype.has_error()) return ffi::Unexpected(dtype.error());
  fp8kit_tensor t = fp8kit_tensor_make(device.type, device.index, *dtype, rank, shape, nullptr);
  t.scaling_mode = Mode(mode);
  return t;
}

constexpr char kQuantize[] = "fp8kit_grouped_quantize_block";

ffi::Error GroupedQuantizeBlockImpl(const Device& device, ffi::AnyBuffer x,
                                    ffi::AnyBuffer group_sizes, ffi::Result<ffi::AnyBuffer> data,
                                    ffi::Result<ffi::AnyBuffer> columnwise,
                                    ffi::Result<ffi::AnyBuffer> block_scale_inv,
                                    ffi::Result<ffi::AnyBuffer> columnwise_block_scale_inv,
                                    bool rowwise, bool want_columnwise, int32_t scaling_mode,
                                    float amax_epsilon, bool power_2_scale, int64_t tokens) {
  auto input = Describe(kQuantize, "x", x, device);
  if (input.has_error()) return input.error();
  if (input->rank != 2) return Invalid(kQuantize, "x must be 2-D [rows, features]");
  int64_t groups = 0;
  auto sizes = DescribeGroupSizes(kQuantize, group_sizes, device, &groups);
  if (sizes.has_error()) return sizes.error();
  // The padded layout cannot tell a wrong count: the sizes against the
  // real rows first (tokens < 0: sizes the layer made itself, not checked).
  if (tokens >= 0) {
    if (auto err = FromStatus(fp8kit_grouped_check_sizes(&*sizes, tokens, device.stream));
        err.failure()) {
      return err;
    }
  }
  // The columnwise result is [F, rows] by its shape only: group g's copy
  // [F, p_g] starts at element F * P_g (fp8kit/grouped.h).
  auto output = DescribeFp8Output(kQuantize, *input, *data, *columnwise, rowwise, want_columnwise);
  if (output.has_error()) return output.error();
  if (!IsBlockMode(scaling_mode)) {
    return Invalid(kQuantize, "scaling_mode must be a block mode (1x128 or 128x128)");
  }
  output->scaling_mode = Mode(scaling_mode);
  const int64_t rows = input->shape[0], features = input->shape[1];
  const std::pair<bool, ffi::AnyBuffer> copies[] = {{false, *block_scale_inv},
                                                    {true, *columnwise_block_scale_inv}};
  for (const auto& [cw, scales] : copies) {
    if (!(cw ? want_columnwise : rowwise)) continue;
    const char* arg = cw ? "the columnwise_block_scale_inv result" : "the block_scale_inv result";
    if (auto err = AttachScales(kQuantize, arg, scales,
                                GroupedFloats(rows, groups, features, scaling_mode, cw), cw,
                                &*output);
        err.failure()) {
      return err;
    }
  }
  const fp8kit_current_scaling_config config{amax_epsilon, power_2_scale ? 1 : 0};
  return FromStatus(
      fp8kit_grouped_quantize_block(&*input, &*sizes, &*output, &config, device.stream));
}

template <typename Binding>
auto BindGroupedQuantizeBlock(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()        // x: [rows, F] float32/bfloat16/float16, padded rows
      .template Arg<ffi::AnyBuffer>()        // group_sizes: int64 [E] or int32 [E, 2], real rows
      .template Ret<ffi::AnyBuffer>()        // data: FP8 [rows, F] (or (0,) if not rowwise)
      .template Ret<ffi::AnyBuffer>()        // columnwise: FP8 [F, rows], group g's at F * P_g
      .template Ret<ffi::AnyBuffer>()        // block_scale_inv: float32, data's scales (or (0,))
      .template Ret<ffi::AnyBuffer>()        // columnwise_block_scale_inv: float32 (or (0,))
      .template Attr<bool>("rowwise")        // rowwise: write data and block_scale_inv
      .template Attr<bool>("columnwise")     // columnwise: write the columnwise copy and scales
      .template Attr<int32_t>("scaling_mode")  // scaling_mode: BLOCK_1X128 or BLOCK_128X128 code
      .template Attr<float>("amax_epsilon")  // amax_epsilon: lower bound on each block's amax
      .template Attr<bool>("power_2_scale")  // power_2_scale: round each scale down to 2^k
      .template Attr<int64_t>("tokens");     // tokens: the real rows, the sizes' sum (or -1)
}

constexpr char kTokens[] = "fp8kit_grouped_gemm_block_tokens";

ffi::Error GroupedGemmBlockTokensImpl(const Device& device, ffi::AnyBuffer a,
                                      ffi::AnyBuffer a_scales, ffi::AnyBuffer b,
                                      ffi::AnyBuffer b_scales, ffi::AnyBuffer bias,
                                      ffi::AnyBuffer group_sizes, ffi::Result<ffi::AnyBuffer> d,
                                      bool trans_b, bool b_columnwise, bool has_bias,
                                      bool use_split_accumulator, int32_t a_scaling_mode,
                                      int32_t b_scaling_mode) {
  int64_t groups = 0;
  auto sizes = DescribeGroupSizes(kTokens, group_sizes, device, &groups);
  if (sizes.has_error()) return sizes.error();
  const auto ad = a.dimensions(), bd = b.dimensions();
  if (ad.size() != 2) return Invalid(kTokens, "a must be 2-D [rows, K], padded rows");
  if (bd.size() != 3) return Invalid(kTokens, "b must be 3-D, one matrix per group");
  const int64_t a_shape[2] = {ad[0], ad[1]};
  auto at = Operand(kTokens, "a", a, a_scaling_mode, device, 2, a_shape);
  if (at.has_error()) return at.error();
  at->data = a.untyped_data();
  if (auto err = AttachScales(kTokens, "a's block scales", a_scales,
                              GroupedFloats(ad[0], groups, ad[1], a_scaling_mode, false), false,
                              &*at);
      err.failure()) {
    return err;
  }
  // b's logical shape is [E, R, C]; its columnwise copy is [E, C, R].
  const int64_t b_shape[3] = {bd[0], b_columnwise ? bd[2] : bd[1], b_columnwise ? bd[1] : bd[2]};
  auto bt = Operand(kTokens, "b", b, b_scaling_mode, device, 3, b_shape);
  if (bt.has_error()) return bt.error();
  (b_columnwise ? bt->columnwise_data : bt->data) = b.untyped_data();
  fp8kit_tensor matrix = *bt;  // one group's [R, C], for its scale count
  matrix.rank = 2;
  matrix.shape[0] = b_shape[1];
  matrix.shape[1] = b_shape[2];
  int64_t per_matrix[2] = {0, 0};
  if (auto err = FromStatus(fp8kit_block_scale_inv_shape(&matrix, b_columnwise, per_matrix));
      err.failure()) {
    return err;
  }
  if (auto err = AttachScales(kTokens, "b's block scales", b_scales,
                              bd[0] * per_matrix[0] * per_matrix[1], b_columnwise, &*bt);
      err.failure()) {
    return err;
  }
  auto out = Describe(kTokens, "d", *d, device);
  if (out.has_error()) return out.error();
  const int64_t n = trans_b ? b_shape[1] : b_shape[2];
  fp8kit_grouped_gemm_config config{trans_b ? 1 : 0, nullptr, FP8KIT_BFLOAT16,
                                    use_split_accumulator ? 1 : 0};
  if (has_bias) {
    if (!ToFp8kitDtype(bias.element_type(), &config.bias_dtype) ||
        NumElements(bias.dimensions()) != groups * n) {
      return Invalid(kTokens, "bias must be [" + std::to_string(groups) + ", " +
                                  std::to_string(n) + "] (one row per group) in d's dtype");
    }
    config.bias = bias.untyped_data();
  }
  return FromStatus(fp8kit_grouped_gemm(FP8KIT_GROUPED_GEMM_TOKENS, &*at, &*bt, &*out, &*sizes,
                                        &config, device.stream));
}

template <typename Binding>
auto BindGroupedGemmBlockTokens(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()          // a: FP8 [rows, K] rowwise, padded rows
      .template Arg<ffi::AnyBuffer>()          // a_scales: float32, a's grouped block scales
      .template Arg<ffi::AnyBuffer>()          // b: FP8 [E, R, C], or its columnwise copy [E, C, R]
      .template Arg<ffi::AnyBuffer>()          // b_scales: float32, E matrices' block scales
      .template Arg<ffi::AnyBuffer>()          // bias: [E, N] in d's dtype (or (0,))
      .template Arg<ffi::AnyBuffer>()          // group_sizes: int64 [E] or int32 [E, 2]
      .template Ret<ffi::AnyBuffer>()          // d: [rows, N] bfloat16/float32, padded rows
      .template Attr<bool>("trans_b")          // trans_b: op(B_g) = B_g^T (B [E, N, K])
      .template Attr<bool>("b_columnwise")     // b_columnwise: `b` is the columnwise copy
      .template Attr<bool>("has_bias")         // has_bias: add bias row g to group g's rows
      .template Attr<bool>("use_split_accumulator")  // use_split_accumulator: FP32 promotion
      .template Attr<int32_t>("a_scaling_mode")  // a_scaling_mode: a's block mode code
      .template Attr<int32_t>("b_scaling_mode");  // b_scaling_mode: b's block mode code
}

constexpr char kContract[] = "fp8kit_grouped_gemm_block_contract";

ffi::Error GroupedGemmBlockContractImpl(const Device& device, ffi::AnyBuffer a_columnwise,
                                        ffi::AnyBuffer a_scales, ffi::AnyBuffer b_columnwise,
                                        ffi::AnyBuffer b_scales, ffi::AnyBuffer group_sizes,
                                        ffi::Result<ffi::AnyBuffer> d, int64_t rows,
                                        bool use_split_accumulator, int32_t a_scaling_mode,
                                        int32_t b_scaling_mode) {
  int64_t groups = 0;
  auto sizes = DescribeGroupSizes(kContract, group_sizes, device, &groups);
  if (sizes.has_error()) return sizes.error();
  auto out = Describe(kContract, "d", *d, device);
  if (out.has_error()) return out.error();
  if (out->rank != 3) return Invalid(kContract, "d must be 3-D [E, M, N]");
  if (rows < 0) return Invalid(kContract, "rows must be >= 0");
  fp8kit_tensor operands[2];
  const char* names[2] = {"a_columnwise", "b_columnwise"};
  const ffi::AnyBuffer copies[2] = {a_columnwise, b_columnwise};
  const ffi::AnyBuffer scales[2] = {a_scales, b_scales};
  const int32_t modes[2] = {a_scaling_mode, b_scaling_mode};
  for (int i = 0; i < 2; ++i) {
    // a is [rows, M], b [rows, N]: D's dims 1 and 2.
    const int64_t features = out->shape[1 + i];
    const int64_t shape[2] = {rows, features};
    auto t = Operand(kContract, names[i], copies[i], modes[i], device, 2, shape);
    if (t.has_error()) return t.error();
    if (NumElements(copies[i].dimensions()) != features * rows) {
      return Invalid(kContract, std::string(names[i]) + " must hold the columnwise copy of " +
                                    std::to_string(rows) + " padded rows x " +
                                    std::to_string(features) + " features");
    }
    t->columnwise_data = copies[i].untyped_data();
    const std::string arg = std::string(names[i]) + "'s block scales";
    if (auto err = AttachScales(kContract, arg.c_str(), scales[i],
                                GroupedFloats(rows, groups, features, modes[i], true), true, &*t);
        err.failure()) {
      return err;
    }
    operands[i] = *t;
  }
  const fp8kit_grouped_gemm_config config{0, nullptr, FP8KIT_BFLOAT16,
                                          use_split_accumulator ? 1 : 0};
  return FromStatus(fp8kit_grouped_gemm(FP8KIT_GROUPED_GEMM_CONTRACT_TOKENS, &operands[0],
                                        &operands[1], &*out, &*sizes, &config, device.stream));
}

template <typename Binding>
auto BindGroupedGemmBlockContract(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()          // a_columnwise: FP8 [M, rows], padded tokens
      .template Arg<ffi::AnyBuffer>()          // a_scales: float32, its grouped block scales
      .template Arg<ffi::AnyBuffer>()          // b_columnwise: FP8 [N, rows], padded tokens
      .template Arg<ffi::AnyBuffer>()          // b_scales: float32, its grouped block scales
      .template Arg<ffi::AnyBuffer>()          // group_sizes: int64 [E] or int32 [E, 2]
      .template Ret<ffi::AnyBuffer>()          // d: [E, M, N] bfloat16/float32
      .template Attr<int64_t>("rows")          // rows: the padded rows of a and b
      .template Attr<bool>("use_split_accumulator")  // use_split_accumulator: FP32 promotion
      .template Attr<int32_t>("a_scaling_mode")  // a_scaling_mode: a's block mode code
      .template Attr<int32_t>("b_scaling_mode");  // b_scaling_mode: b's block mode code
}

}  // namespace
}  // namespace fp8kit_jax

FP8KIT_JAX_HANDLER_UNCAPTURED(grouped_quantize_block, fp8kit_jax::GroupedQuantizeBlockImpl,
                              fp8kit_jax::BindGroupedQuantizeBlock);
FP8KIT_JAX_HANDLER_UNCAPTURED(grouped_gemm_block_tokens, fp8kit_jax::GroupedGemmBlockTokensImpl,
                              fp8kit_jax::BindGroupedGemmBlockTokens);
FP8KIT_JAX_HANDLER_UNCAPTURED(grouped_gemm_block_contract,
                              fp8kit_jax::GroupedGemmBlockContractImpl,
                              fp8kit_jax::BindGroupedGemmBlockContract);
