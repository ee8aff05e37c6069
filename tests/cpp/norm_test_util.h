// Runners of fp8kit_norm_forward / fp8kit_norm_backward on the CPU or a
// GPU for the normalization tests: inputs as host bytes, every output
// downloaded.
#ifndef FP8KIT_TESTS_CPP_NORM_TEST_UTIL_H_
#define FP8KIT_TESTS_CPP_NORM_TEST_UTIL_H_

#include <cstring>
#include <string>
#include <vector>

#include "fp8kit/fp8kit.h"
#include "fused_cast_util.h"
#include "quant_test_util.h"

namespace normtest {

struct NormInputs {
  fp8kit_norm_config config{FP8KIT_LAYERNORM, 1e-5f};
  fp8kit_dtype dtype = FP8KIT_BFLOAT16;
  std::vector<int64_t> shape;  // x's
  std::vector<uint8_t> x, gamma, beta, dy;
};

// x ~ offset + N(0, 1) per row (so that the mean matters), gamma ~ 1 +
// N(0, 0.2), beta ~ N(0, 0.5), dy ~ N(0, 1), encoded in `dtype`.
inline NormInputs make_inputs(fp8kit_norm_type type, fp8kit_dtype dtype,
                              std::vector<int64_t> shape, uint32_t seed) {
  NormInputs in;
  in.config.type = type;
  in.dtype = dtype;
  in.shape = std::move(shape);
  const auto [rows, hidden] = qtest::flat2d(in.shape);
  std::vector<float> x = qtest::random_values(size_t(rows * hidden), 1.0f, seed, false);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < hidden; ++c) x[size_t(r * hidden + c)] += float(r % 7) - 2.0f;
  }
  std::vector<float> g = qtest::random_values(size_t(hidden), 0.2f, seed + 1, false);
  for (float& v : g) v += 1.0f;
  in.x = qtest::encode_input(x, dtype);
  in.gamma = qtest::encode_input(g, dtype);
  in.beta = qtest::encode_input(qtest::random_values(size_t(hidden), 0.5f, seed + 2, false), dtype);
  in.dy = qtest::encode_input(qtest::random_values(size_t(rows * hidden), 1.0f, seed + 3, false),
                              dtype);
  return in;
}

struct ForwardResult {
  fp8kit_status status = FP8KIT_INTERNAL;
  std::string error;
  std::vector<uint8_t> y, mean, rsigma;
  fusedtest::CastResult cast;
};

// `calls` forward calls in a row on the same state (the last one's outputs);
// without `cast_output`, y_fp8 and cast are NULL (y, mean and rsigma alone).
inline ForwardResult run_forward(fp8kit_device_type dev, const NormInputs& in,
                                 const fusedtest::CastSpec& spec, int calls = 1,
                                 bool cast_output = true) {
  const auto [rows, hidden] = qtest::flat2d(in.shape);
  const bool ln = in.config.type == FP8KIT_LAYERNORM;
  const size_t es = fp8kit_dtype_size(in.dtype);
  qtest::Buffer x(dev, in.x.size()), gamma(dev, in.gamma.size()), beta(dev, in.beta.size()),
      y(dev, size_t(rows * hidden) * es), mean(dev, size_t(rows) * 4), rsigma(dev, size_t(rows) * 4);
  x.upload(in.x.data(), in.x.size());
  gamma.upload(in.gamma.data(), in.gamma.size());
  beta.upload(in.beta.data(), in.beta.size());
  fusedtest::CastBuffers cast(dev, spec, in.shape);
  const int64_t h_shape[1] = {hidden}, r_shape[1] = {rows};
  fp8kit_tensor tx = qtest::make_tensor(dev, in.dtype, in.shape, x.ptr());
  fp8kit_tensor tg = fp8kit_tensor_make(dev, 0, in.dtype, 1, h_shape, gamma.ptr());
  fp8kit_tensor tb = fp8kit_tensor_make(dev, 0, in.dtype, 1, h_shape, beta.ptr());
  fp8kit_tensor ty = qtest::make_tensor(dev, in.dtype, in.shape, y.ptr());
  fp8kit_tensor tm = fp8kit_tensor_make(dev, 0, FP8KIT_FLOAT32, 1, r_shape, mean.ptr());
  fp8kit_tensor tr = fp8kit_tensor_make(dev, 0, FP8KIT_FLOAT32, 1, r_shape, rsigma.ptr());
  fp8kit_tensor out = cast.out();
  const fp8kit_fused_cast c = cast.cast();
  ForwardResult r;
  for (int i = 0; i < calls; ++i) {
    r.status = fp8kit_norm_forward(&in.config, &tx, &tg, ln ? &tb : nullptr, &ty,
                                   cast_output ? &out : nullptr, cast_output ? &c : nullptr,
                                   ln ? &tm : nullptr, &tr, nullptr);
    r.error = fp8kit_last_error();
    if (r.status != FP8KIT_OK) return r;
  }
  r.y = y.download(size_t(rows * hidden) * es);
  if (ln) r.mean = mean.download(size_t(rows) * 4);
  r.rsigma = rsigma.download(size_t(rows) * 4);
  if (cast_output) r.cast = cast.result();
  return r;
}

struct BackwardResult {
  fp8kit_status status = FP8KIT_INTERNAL;
  std::string error;
  std::vector<uint8_t> dx, dgamma, dbeta;
};

// Backward from the statistics `fwd` wrote; dgamma/dbeta in `grad_dtype`.
inline BackwardResult run_backward(fp8kit_device_type dev, const NormInputs& in,
                                   const ForwardResult& fwd, fp8kit_dtype grad_dtype) {
  const auto [rows, hidden] = qtest::flat2d(in.shape);
  const bool ln = in.config.type == FP8KIT_LAYERNORM;
  const size_t es = fp8kit_dtype_size(in.dtype), gs = fp8kit_dtype_size(grad_dtype);
  qtest::Buffer x(dev, in.x.size()), dy(dev, in.dy.size()), gamma(dev, in.gamma.size()),
      mean(dev, size_t(rows) * 4), rsigma(dev, size_t(rows) * 4), dx(dev, size_t(rows * hidden) * es),
      dgamma(dev, size_t(hidden) * gs), dbeta(dev, size_t(hidden) * gs),
      ws(dev, size_t(fp8kit_norm_backward_workspace(rows, hidden)) * 4);
  x.upload(in.x.data(), in.x.size());
  dy.upload(in.dy.data(), in.dy.size());
  gamma.upload(in.gamma.data(), in.gamma.size());
  if (ln) mean.upload(fwd.mean.data(), fwd.mean.size());
  rsigma.upload(fwd.rsigma.data(), fwd.rsigma.size());
  const int64_t h_shape[1] = {hidden}, r_shape[1] = {rows};
  fp8kit_tensor tx = qtest::make_tensor(dev, in.dtype, in.shape, x.ptr());
  fp8kit_tensor tdy = qtest::make_tensor(dev, in.dtype, in.shape, dy.ptr());
  fp8kit_tensor tdx = qtest::make_tensor(dev, in.dtype, in.shape, dx.ptr());
  fp8kit_tensor tg = fp8kit_tensor_make(dev, 0, in.dtype, 1, h_shape, gamma.ptr());
  fp8kit_tensor tm = fp8kit_tensor_make(dev, 0, FP8KIT_FLOAT32, 1, r_shape, mean.ptr());
  fp8kit_tensor tr = fp8kit_tensor_make(dev, 0, FP8KIT_FLOAT32, 1, r_shape, rsigma.ptr());
  fp8kit_tensor tdg = fp8kit_tensor_make(dev, 0, grad_dtype, 1, h_shape, dgamma.ptr());
  fp8kit_tensor tdb = fp8kit_tensor_make(dev, 0, grad_dtype, 1, h_shape, dbeta.ptr());
  BackwardResult r;
  r.status = fp8kit_norm_backward(&in.config, &tdy, &tx, ln ? &tm : nullptr, &tr, &tg, &tdx, &tdg,
                                  ln ? &tdb : nullptr, ws.fptr(), nullptr);
  r.error = fp8kit_last_error();
  if (r.status != FP8KIT_OK) return r;
  r.dx = dx.download(size_t(rows * hidden) * es);
  r.dgamma = dgamma.download(size_t(hidden) * gs);
  if (ln) r.dbeta = dbeta.download(size_t(hidden) * gs);
  return r;
}

inline std::vector<float> as_floats(const std::vector<uint8_t>& b) {
  std::vector<float> f(b.size() / 4);
  if (!f.empty()) std::memcpy(f.data(), b.data(), b.size());
  return f;
}

}  // namespace normtest

#endif  // FP8KIT_TESTS_CPP_NORM_TEST_UTIL_H_
