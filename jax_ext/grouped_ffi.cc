// FFI handlers for the grouped ops of a mixture of experts
// (fp8kit/grouped.h), for fp8kit.jax.grouped_dense:
//   fp8kit_grouped_quantize        per-group per-tensor cast of a
//                                  token-grouped [T, F]
//   fp8kit_grouped_gemm_tokens     D [T, N] = A_g @ op(B_g) per group
//   fp8kit_grouped_gemm_contract   D [E, M, N] = A_g^T @ B_g per group
// The delayed-scaling cast is in grouped_delayed_ffi.cc, the block-scaled
// ops in grouped_block_ffi.cc.
//
// Buffers as the core lays them out: per-group scales are float32
// [E, FP8KIT_GROUP_SCALE_STRIDE] (group g's value in column 0); the grouped
// columnwise copy of [T, F] is flat, F * fp8kit_grouped_columnwise_tokens(T,
// E) elements. A copy not asked for is an empty (0,) placeholder.
//
// group_sizes: the core reads int64 counts. JAX has no int64 arrays unless
// jax_enable_x64 is set, so a handler takes either int64 [E] or int32
// [E, 2], each count as its two 32-bit words (low, high): the same bytes on
// the little-endian hosts and GPUs fp8kit runs on, built by fp8kit.jax
// without a conversion here (which on CUDA would need a kernel).
//
// None of these handlers may be recorded into a CUDA graph: the core copies
// the group sizes to the host and waits on the stream to plan the
// per-group work (fp8kit/grouped.h), and a graph may hold no wait.
#include <string>
#include <utility>

#include "ffi_helpers.h"
#include "fp8kit/grouped.h"
#include "grouped_ffi.h"
#include "handlers.h"

namespace fp8kit_jax {

ffi::ErrorOr<fp8kit_tensor> DescribeGroupSizes(const char* op, ffi::AnyBuffer sizes,
                                               const Device& device, int64_t* groups) {
  const auto d = sizes.dimensions();
  const bool s64 = sizes.element_type() == ffi::DataType::S64 && d.size() == 1;
  const bool s32_pairs =
      sizes.element_type() == ffi::DataType::S32 && d.size() == 2 && d[1] == 2;
  if (!s64 && !s32_pairs) {
    return ffi::Unexpected(Invalid(op, "group_sizes must be int64 [E] or int32 [E, 2] (each "
                                       "count's low and high words), got " +
                                       XlaTypeName(sizes.element_type()) + " of rank " +
                                       std::to_string(d.size())));
  }
  *groups = d[0];
  const int64_t shape[1] = {d[0]};
  return fp8kit_tensor_make(device.type, device.index, FP8KIT_INT64, 1, shape,
                            sizes.untyped_data());
}

ffi::Error CheckGroupScales(const char* op, const char* arg, ffi::AnyBuffer t, int64_t groups) {
  const auto d = t.dimensions();
  if (t.element_type() == ffi::DataType::F32 && d.size() == 2 && d[0] == groups &&
      d[1] == kStride) {
    return ffi::Error::Success();
  }
  return Invalid(op, std::string(arg) + " must be float32 [" + std::to_string(groups) + ", " +
                         std::to_string(kStride) + "] (one group's scale per row)");
}

ffi::ErrorOr<fp8kit_dtype> GroupFp8Type(const char* op, const char* arg, ffi::AnyBuffer t) {
  fp8kit_dtype d;
  if (!ToFp8kitDtype(t.element_type(), &d) || (d != FP8KIT_E4M3 && d != FP8KIT_E5M2)) {
    return ffi::Unexpected(Invalid(op, std::string(arg) + " has element type " +
                                       XlaTypeName(t.element_type()) +
                                       "; expected float8_e4m3fn or float8_e5m2"));
  }
  return d;
}

ffi::ErrorOr<fp8kit_tensor> DescribeGroupedOutput(const char* op, const fp8kit_tensor& input,
                                                  int64_t groups, ffi::AnyBuffer data,
                                                  ffi::AnyBuffer columnwise, bool rowwise,
                                                  bool want_columnwise) {
  if (input.rank != 2) return ffi::Unexpected(Invalid(op, "x must be 2-D [tokens, features]"));
  if (!rowwise && !want_columnwise) {
    return ffi::Unexpected(Invalid(op, "ask for rowwise and/or columnwise output"));
  }
  const int64_t tokens = input.shape[0], features = input.shape[1];
  const int64_t capacity = fp8kit_grouped_columnwise_tokens(tokens, groups);
  fp8kit_tensor output = input;
  output.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  const std::pair<bool, ffi::AnyBuffer> fp8_results[] = {{rowwise, data},
                                                         {want_columnwise, columnwise}};
  bool have_dtype = false;
  for (const auto& [wanted, buf] : fp8_results) {
    if (!wanted) continue;
    auto dtype = GroupFp8Type(op, "an FP8 result", buf);
    if (dtype.has_error()) return ffi::Unexpected(dtype.error());
    if (have_dtype && *dtype != output.dtype) {
      return ffi::Unexpected(
          Invalid(op, "rowwise and columnwise results have different FP8 types"));
    }
    output.dtype = *dtype;
    have_dtype = true;
  }
  const auto d = data.dimensions();
  if (rowwise && (d.size() != 2 || d[0] != tokens || d[1] != features)) {
    return ffi::Unexpected(Invalid(op, "the rowwise result must have x's shape"));
  }
  if (want_columnwise && NumElements(columnwise.dimensions()) != features * capacity) {
    return ffi::Unexpected(Invalid(op, "the columnwise result must hold features x " +
                                           std::to_string(capacity) + " = " +
                                           std::to_string(features * capacity) + " elements"));
  }
  output.data = rowwise ? data.untyped_data() : nullptr;
  output.columnwise_data = want_columnwise ? columnwise.untyped_data() : nullptr;
  return output;
}

namespace {

constexpr char kQuantize[] = "fp8kit_grouped_quantize";

ffi::Error GroupedQuantizeImpl(const Device& device, ffi::AnyBuffer x, ffi::AnyBuffer group_sizes,
                               ffi::AnyBuffer scale, ffi::Result<ffi::AnyBuffer> data,
                               ffi::Result<ffi::AnyBuffer> columnwise,
                               ffi::Result<ffi::AnyBuffer> scale_out,
                               ffi::Result<ffi::AnyBuffer> scale_inv,
                               ffi::Result<ffi::AnyBuffer> amax, bool rowwise,
                               bool want_columnwise, bool current, float amax_epsilon,
                               bool power_2_scale) {
  auto input = Describe(kQuantize, "x", x, device);
  if (input.has_error()) return input.error();
  int64_t groups = 0;
  auto sizes = DescribeGroupSizes(kQuantize, group_sizes, device, &groups);
  if (sizes.has_error()) return sizes.error();
  const std::pair<const char*, ffi::AnyBuffer> scale_results[] = {
      {"the scale result", *scale_out}, {"the scale_inv result", *scale_inv},
      {"the amax result", *amax}};
  for (const auto& [arg, buf] : scale_results) {
    if (auto err = CheckGroupScales(kQuantize, arg, buf, groups); err.failure()) return err;
  }
  if (!current) {
    if (auto err = CheckGroupScales(kQuantize, "scale", scale, groups); err.failure()) return err;
  }
  auto output = DescribeGroupedOutput(kQuantize, *input, groups, *data, *columnwise, rowwise,
                                      want_columnwise);
  if (output.has_error()) return output.error();
  // The core writes column 0 of each scale row; the rest is zeroed so that
  // every result element is defined.
  const size_t scale_bytes = static_cast<size_t>(groups * kStride) * sizeof(float);
  for (void* p : {scale_inv->untyped_data(), amax->untyped_data()}) {
    if (auto err = ZeroBytes(kQuantize, device, p, scale_bytes); err.failure()) return err;
  }
  ffi::Error init = current ? ZeroBytes(kQuantize, device, scale_out->untyped_data(), scale_bytes)
                            : CopyIfDistinct(kQuantize, device, scale_out->untyped_data(),
                                             scale.untyped_data(), scale_bytes);
  if (init.failure()) return init;
  output->scale = static_cast<float*>(scale_out->untyped_data());
  output->scale_inv = static_cast<float*>(scale_inv->untyped_data());
  output->amax = static_cast<float*>(amax->untyped_data());
  fp8kit_current_scaling_config config{amax_epsilon, power_2_scale ? 1 : 0};
  return FromStatus(fp8kit_grouped_quantize(&*input, &*sizes, &*output,
                                            current ? &config : nullptr, device.stream));
}

template <typename Binding>
auto BindGroupedQuantize(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()          // x: [T, F] float32/bfloat16/float16, by group
      .template Arg<ffi::AnyBuffer>()          // group_sizes: int64 [E] or int32 [E, 2] (see above)
      .template Arg<ffi::AnyBuffer>()          // scale: float32 [E, 4] given (or (0,): current)
      .template Ret<ffi::AnyBuffer>()          // data: FP8 [T, F] (or (0,) if not rowwise)
      .template Ret<ffi::AnyBuffer>()          // columnwise: FP8, the flat grouped copy (or (0,))
      .template Ret<ffi::AnyBuffer>()          // scale: float32 [E, 4], the scales cast with
      .template Ret<ffi::AnyBuffer>()          // scale_inv: float32 [E, 4], their reciprocals
      .template Ret<ffi::AnyBuffer>()          // amax: float32 [E, 4], each group's max |x|
      .template Attr<bool>("rowwise")          // rowwise: write `data`
      .template Attr<bool>("columnwise")       // columnwise: write `columnwise`
      .template Attr<bool>("current")          // current: scales from each group's amax
      .template Attr<float>("amax_epsilon")    // amax_epsilon: lower bound on amax (current)
      .template Attr<bool>("power_2_scale");   // power_2_scale: round scale down to 2^k (current)
}

// An FP8 operand read with per-group scale_inv [E, 4]; its shape is set by
// the caller.
ffi::ErrorOr<fp8kit_tensor> DescribeOperand(const char* op, const char* arg, ffi::AnyBuffer buf,
                                            ffi::AnyBuffer scale_inv, int64_t groups,
                                            const Device& device) {
  auto dtype = GroupFp8Type(op, arg, buf);
  if (dtype.has_error()) return ffi::Unexpected(dtype.error());
  const std::string scales = std::string(arg) + "'s scale_inv";
  if (auto err = CheckGroupScales(op, scales.c_str(), scale_inv, groups); err.failure()) {
    return ffi::Unexpected(std::move(err));
  }
  const int64_t shape[1] = {0};
  fp8kit_tensor t = fp8kit_tensor_make(device.type, device.index, *dtype, 1, shape, nullptr);
  t.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  t.scale_inv = static_cast<float*>(scale_inv.untyped_data());  // read only
  return t;
}

constexpr char kTokens[] = "fp8kit_grouped_gemm_tokens";

ffi::Error GroupedGemmTokensImpl(const Device& device, ffi::AnyBuffer a, ffi::AnyBuffer a_scale_inv,
                                 ffi::AnyBuffer b, ffi::AnyBuffer b_scale_inv, ffi::AnyBuffer bias,
                                 ffi::AnyBuffer group_sizes, ffi::Result<ffi::AnyBuffer> d,
                                 bool trans_b, bool b_columnwise, bool has_bias,
                                 bool use_split_accumulator, int64_t b_rows, int64_t b_cols) {
  int64_t groups = 0;
  auto sizes = DescribeGroupSizes(kTokens, group_sizes, device, &groups);
  if (sizes.has_error()) return sizes.error();
  auto at = DescribeOperand(kTokens, "a", a, a_scale_inv, groups, device);
  if (at.has_error()) return at.error();
  auto bt = DescribeOperand(kTokens, "b", b, b_scale_inv, groups, device);
  if (bt.has_error()) return bt.error();
  const auto ad = a.dimensions(), bd = b.dimensions();
  if (ad.size() != 2) return Invalid(kTokens, "a must be 2-D [tokens, K]");
  // b's logical shape is [E, R, C] (b_rows, b_cols); its columnwise copy is
  // [E, C, R], which may also come as the flat grouped columnwise buffer it
  // was written to (its first E * C * R elements read), so that no slice of
  // it is made.
  const bool flat = bd.size() == 1 && b_columnwise;
  if (!flat && (bd.size() != 3 || bd[0] != groups ||
                bd[1] != (b_columnwise ? b_cols : b_rows) ||
                bd[2] != (b_columnwise ? b_rows : b_cols))) {
    return Invalid(kTokens, "b must be [E, b_rows, b_cols], or its columnwise copy [E, b_cols, "
                            "b_rows] (also flat, holding at least that many elements)");
  }
  if (flat && bd[0] < groups * b_rows * b_cols) {
    return Invalid(kTokens, "the flat columnwise b holds fewer than E * b_rows * b_cols elements");
  }
  at->rank = 2;
  at->shape[0] = ad[0];
  at->shape[1] = ad[1];
  at->data = a.untyped_data();
  bt->rank = 3;
  bt->shape[0] = groups;
  bt->shape[1] = b_rows;
  bt->shape[2] = b_cols;
  (b_columnwise ? bt->columnwise_data : bt->data) = b.untyped_data();
  auto out = Describe(kTokens, "d", *d, device);
  if (out.has_error()) return out.error();
  const int64_t n = trans_b ? bt->shape[1] : bt->shape[2];
  fp8kit_grouped_gemm_config config{trans_b ? 1 : 0, nullptr, FP8KIT_BFLOAT16,
                                    use_split_accumulator ? 1 : 0};
  if (has_bias) {
    if (!ToFp8kitDtype(bias.element_type(), &config.bias_dtype) ||
        NumElements(bias.dimensions()) != groups * n) {
      return Invalid(kTokens, "bias must be [" + std::to_string(groups) + ", " +
                                  std::to_string(n) + "] (one row per group) of a 16-bit or "
                                  "float32 type");
    }
    config.bias = bias.untyped_data();
  }
  return FromStatus(fp8kit_grouped_gemm(FP8KIT_GROUPED_GEMM_TOKENS, &*at, &*bt, &*out, &*sizes,
                                        &config, device.stream));
}

template <typename Binding>
auto BindGroupedGemmTokens(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()          // a: FP8 [T, K] rowwise, token-grouped
      .template Arg<ffi::AnyBuffer>()          // a_scale_inv: float32 [E, 4]
      .template Arg<ffi::AnyBuffer>()          // b: FP8 [E, R, C], or its columnwise copy
                                               // [E, C, R] (or flat, at least E * C * R)
      .template Arg<ffi::AnyBuffer>()          // b_scale_inv: float32 [E, 4]
      .template Arg<ffi::AnyBuffer>()          // bias: [E, N] (or (0,) without bias)
      .template Arg<ffi::AnyBuffer>()          // group_sizes: int64 [E] or int32 [E, 2]
      .template Ret<ffi::AnyBuffer>()          // d: [T, N] bfloat16/float16/float32
      .template Attr<bool>("trans_b")          // trans_b: op(B_g) = B_g^T (B [E, N, K])
      .template Attr<bool>("b_columnwise")     // b_columnwise: `b` is the columnwise copy
      .template Attr<bool>("has_bias")         // has_bias: add bias row g to group g's rows
      .template Attr<bool>("use_split_accumulator")  // use_split_accumulator: FP32 promotion
      .template Attr<int64_t>("b_rows")        // b_rows: R of each group's matrix
      .template Attr<int64_t>("b_cols");       // b_cols: C of each group's matrix
}

constexpr char kContract[] = "fp8kit_grouped_gemm_contract";

ffi::Error GroupedGemmContractImpl(const Device& device, ffi::AnyBuffer a_columnwise,
                                   ffi::AnyBuffer a_scale_inv, ffi::AnyBuffer b_columnwise,
                                   ffi::AnyBuffer b_scale_inv, ffi::AnyBuffer group_sizes,
                                   ffi::Result<ffi::AnyBuffer> d, int64_t tokens,
                                   bool use_split_accumulator) {
  int64_t groups = 0;
  auto sizes = DescribeGroupSizes(kContract, group_sizes, device, &groups);
  if (sizes.has_error()) return sizes.error();
  auto out = Describe(kContract, "d", *d, device);
  if (out.has_error()) return out.error();
  if (out->rank != 3) return Invalid(kContract, "d must be 3-D [E, M, N]");
  if (tokens < 0) return Invalid(kContract, "tokens must be >= 0");
  const int64_t capacity = fp8kit_grouped_columnwise_tokens(tokens, groups);
  fp8kit_tensor operands[2];
  const std::pair<const char*, ffi::AnyBuffer> copies[2] = {{"a_columnwise", a_columnwise},
                                                            {"b_columnwise", b_columnwise}};
  const ffi::AnyBuffer scales[2] = {a_scale_inv, b_scale_inv};
  for (int i = 0; i < 2; ++i) {
    const auto& [arg, buf] = copies[i];
    auto t = DescribeOperand(kContract, arg, buf, scales[i], groups, device);
    if (t.has_error()) return t.error();
    // a is [T, M], b [T, N]: D's dims 1 and 2.
    const int64_t features = out->shape[1 + i];
    if (NumElements(buf.dimensions()) != features * capacity) {
      return Invalid(kContract, std::string(arg) + " must hold the grouped columnwise copy of " +
                                    std::to_string(tokens) + " tokens x " +
                                    std::to_string(features) + " features in " +
                                    std::to_string(groups) + " groups, " +
                                    std::to_string(features * capacity) + " elements");
    }
    t->rank = 2;
    t->shape[0] = tokens;
    t->shape[1] = features;
    t->columnwise_data = buf.untyped_data();
    operands[i] = *t;
  }
  const fp8kit_grouped_gemm_config config{0, nullptr, FP8KIT_BFLOAT16,
                                          use_split_accumulator ? 1 : 0};
  return FromStatus(fp8kit_grouped_gemm(FP8KIT_GROUPED_GEMM_CONTRACT_TOKENS, &operands[0],
                                        &operands[1], &*out, &*sizes, &config, device.stream));
}

template <typename Binding>
auto BindGroupedGemmContract(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()          // a_columnwise: FP8, a [T, M]'s flat grouped copy
      .template Arg<ffi::AnyBuffer>()          // a_scale_inv: float32 [E, 4]
      .template Arg<ffi::AnyBuffer>()          // b_columnwise: FP8, b [T, N]'s flat grouped copy
      .template Arg<ffi::AnyBuffer>()          // b_scale_inv: float32 [E, 4]
      .template Arg<ffi::AnyBuffer>()          // group_sizes: int64 [E] or int32 [E, 2]
      .template Ret<ffi::AnyBuffer>()          // d: [E, M, N] bfloat16/float16/float32
      .template Attr<int64_t>("tokens")        // tokens: T, the rows of a and b
      .template Attr<bool>("use_split_accumulator");  // use_split_accumulator: FP32 promotion
}

}  // namespace
}  // namespace fp8kit_jax

FP8KIT_JAX_HANDLER_UNCAPTURED(grouped_quantize, fp8kit_jax::GroupedQuantizeImpl,
                              fp8kit_jax::BindGroupedQuantize);
FP8KIT_JAX_HANDLER_UNCAPTURED(grouped_gemm_tokens, fp8kit_jax::GroupedGemmTokensImpl,
                              fp8kit_jax::BindGroupedGemmTokens);
FP8KIT_JAX_HANDLER_UNCAPTURED(grouped_gemm_contract, fp8kit_jax::GroupedGemmContractImpl,
                              fp8kit_jax::BindGroupedGemmContract);
