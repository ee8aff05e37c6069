// fp8kit_linear_plan_make: which copies each slot of a Linear writes and
// keeps, from the GEMM layouts the device reads (fp8kit/linear.h).
#include "fp8kit/linear.h"

#include <cstdint>

#include "error.h"

namespace fp8kit {
namespace {

constexpr const char* kOp = "linear_plan_make";

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

void check_features(const char* name, int64_t value) {
  FP8KIT_CHECK(value > 0 && value % FP8KIT_GEMM_DIM_MULTIPLE == 0, kOp, ": ", name, " is ",
               value, "; it must be a positive multiple of ", FP8KIT_GEMM_DIM_MULTIPLE,
               " (the FP8 GEMMs' alignment): pad the layer to a multiple of ",
               FP8KIT_GEMM_DIM_MULTIPLE);
}

void check_args(int64_t tokens, int64_t in_features, int64_t out_features,
                fp8kit_weight_layout weight_layout, const fp8kit_linear_plan* plan) {
  FP8KIT_CHECK(plan != nullptr, kOp, ": plan is NULL; pass a fp8kit_linear_plan to fill");
  FP8KIT_CHECK(tokens >= 0, kOp, ": tokens is ", tokens, "; the token count must be >= 0");
  check_features("in_features", in_features);
  check_features("out_features", out_features);
  FP8KIT_CHECK(weight_layout == FP8KIT_WEIGHT_OUT_IN || weight_layout == FP8KIT_WEIGHT_IN_OUT,
               kOp, ": weight_layout is ", int(weight_layout),
               "; use FP8KIT_WEIGHT_OUT_IN ([N, K]) or FP8KIT_WEIGHT_IN_OUT ([K, N])");
}

fp8kit_copies copies(bool rowwise, bool columnwise) {
  return fp8kit_copies{rowwise ? 1 : 0, columnwise ? 1 : 0};
}

// TN-only devices: every GEMM operand contiguous along its inner
// dimension. The forward reads x and w along K; dgrad reads dy along N
// and w along N; wgrad reads dy and x along M, i.e. their columnwise
// copies, whose M is padded to the GEMM alignment.
fp8kit_linear_plan plan_tn(int64_t tokens, bool out_in, bool dgrad, bool wgrad) {
  fp8kit_linear_plan p{};
  p.quantize[FP8KIT_SLOT_INPUT] = copies(true, wgrad);
  // OUT_IN [N, K]: rowwise is K-contiguous (forward), columnwise
  // N-contiguous (dgrad); IN_OUT [K, N] the other way round.
  p.quantize[FP8KIT_SLOT_WEIGHT] = out_in ? copies(true, dgrad) : copies(dgrad, true);
  p.quantize[FP8KIT_SLOT_GRAD_OUTPUT] = copies(dgrad, wgrad);
  p.saved_input = copies(false, wgrad);
  p.saved_weight = out_in ? copies(false, dgrad) : copies(dgrad, false);
  p.wgrad_columnwise = 1;
  p.wgrad_inner = round_up(tokens, FP8KIT_GEMM_DIM_MULTIPLE);
  return p;
}

// Non-TN devices read any layout, so one rowwise copy per tensor serves
// every GEMM, except that wgrad's inner dimension M must be a multiple of
// the alignment: when it is not, wgrad reads zero-padded columnwise copies.
fp8kit_linear_plan plan_non_tn(int64_t tokens, bool dgrad, bool wgrad) {
  const bool cw = tokens % FP8KIT_GEMM_DIM_MULTIPLE != 0;
  fp8kit_linear_plan p{};
  p.quantize[FP8KIT_SLOT_INPUT] = copies(true, wgrad && cw);
  p.quantize[FP8KIT_SLOT_WEIGHT] = copies(true, false);
  p.quantize[FP8KIT_SLOT_GRAD_OUTPUT] = copies(dgrad || (wgrad && !cw), wgrad && cw);
  p.saved_input = copies(wgrad && !cw, wgrad && cw);
  p.saved_weight = copies(dgrad, false);
  p.wgrad_columnwise = cw ? 1 : 0;
  p.wgrad_inner = cw ? round_up(tokens, FP8KIT_GEMM_DIM_MULTIPLE) : tokens;
  return p;
}

}  // namespace
}  // namespace fp8kit

extern "C" fp8kit_status fp8kit_linear_plan_make(int64_t tokens, int64_t in_features,
                                                 int64_t out_features,
                                                 fp8kit_weight_layout weight_layout, int dgrad,
                                                 int wgrad, int non_tn,
                                                 fp8kit_linear_plan* plan) {
  return fp8kit::guard([&] {
    fp8kit::check_args(tokens, in_features, out_features, weight_layout, plan);
    *plan = non_tn != 0 ? fp8kit::plan_non_tn(tokens, dgrad != 0, wgrad != 0)
                        : fp8kit::plan_tn(tokens, weight_layout == FP8KIT_WEIGHT_OUT_IN,
                                          dgrad != 0, wgrad != 0);
  });
}
