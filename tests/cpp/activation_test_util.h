// Runners of fp8kit_activation_forward / fp8kit_activation_backward on the
// CPU or a GPU for the activation tests.
#ifndef FP8KIT_TESTS_CPP_ACTIVATION_TEST_UTIL_H_
#define FP8KIT_TESTS_CPP_ACTIVATION_TEST_UTIL_H_

#include <string>
#include <vector>

#include "fp8kit/fp8kit.h"
#include "fused_cast_util.h"
#include "quant_test_util.h"

namespace acttest {

struct ActInputs {
  fp8kit_activation act = FP8KIT_GELU;
  fp8kit_dtype dtype = FP8KIT_BFLOAT16;
  std::vector<int64_t> a_shape, h_shape;  // a / d_a, and h ([..., 2F] for SwiGLU)
  std::vector<uint8_t> h, d_a;
};

// h ~ N(0, 3) with specials (0, -0, +-inf, huge, tiny) mixed in when
// `specials`, d_a ~ N(0, 1).
inline ActInputs make_inputs(fp8kit_activation act, fp8kit_dtype dtype, std::vector<int64_t> a_shape,
                             uint32_t seed, bool specials = false) {
  ActInputs in;
  in.act = act;
  in.dtype = dtype;
  in.a_shape = a_shape;
  in.h_shape = a_shape;
  if (act == FP8KIT_SWIGLU) in.h_shape.back() *= 2;
  in.h = qtest::encode_input(
      qtest::random_values(size_t(qtest::numel(in.h_shape)), 3.0f, seed, specials), dtype);
  in.d_a = qtest::encode_input(
      qtest::random_values(size_t(qtest::numel(a_shape)), 1.0f, seed + 1, false), dtype);
  return in;
}

struct ActResult {
  fp8kit_status status = FP8KIT_INTERNAL;
  std::string error;
  std::vector<uint8_t> hp;  // a or dh
  fusedtest::CastResult cast;
};

// `calls` calls in a row on one state (the last one's outputs); without
// `cast_output`, the FP8 output, cast and sums are NULL (a or dh alone).
inline ActResult run(fp8kit_device_type dev, const ActInputs& in, bool backward,
                     const fusedtest::CastSpec& spec, int calls = 1, bool cast_output = true) {
  const std::vector<int64_t>& out_shape = backward ? in.h_shape : in.a_shape;
  const size_t out_bytes = size_t(qtest::numel(out_shape)) * fp8kit_dtype_size(in.dtype);
  qtest::Buffer h(dev, in.h.size()), d_a(dev, in.d_a.size()), hp(dev, out_bytes);
  h.upload(in.h.data(), in.h.size());
  d_a.upload(in.d_a.data(), in.d_a.size());
  fusedtest::CastBuffers cast(dev, spec, out_shape);
  fp8kit_tensor th = qtest::make_tensor(dev, in.dtype, in.h_shape, h.ptr());
  fp8kit_tensor tda = qtest::make_tensor(dev, in.dtype, in.a_shape, d_a.ptr());
  fp8kit_tensor thp = qtest::make_tensor(dev, in.dtype, out_shape, hp.ptr());
  fp8kit_tensor out = cast.out();
  const fp8kit_fused_cast c = cast.cast();
  fp8kit_tensor* out_arg = cast_output ? &out : nullptr;
  const fp8kit_fused_cast* c_arg = cast_output ? &c : nullptr;
  ActResult r;
  for (int i = 0; i < calls; ++i) {
    r.status = backward ? fp8kit_activation_backward(in.act, &tda, &th, &thp, out_arg, c_arg,
                                                     cast_output ? cast.sums() : nullptr, nullptr)
                        : fp8kit_activation_forward(in.act, &th, &thp, out_arg, c_arg, nullptr);
    r.error = fp8kit_last_error();
    if (r.status != FP8KIT_OK) return r;
  }
  r.hp = hp.download(out_bytes);
  if (cast_output) r.cast = cast.result();
  return r;
}

}  // namespace acttest

#endif  // FP8KIT_TESTS_CPP_ACTIVATION_TEST_UTIL_H_
