// Helpers of the block-scaled GEMM tests: operands quantized by
// fp8kit_quantize_block_scaling on the CPU (checked on their own in
// block_quantize_test.cc), a float64 reference GEMM of the dequantized
// operands written from fp8kit/gemm.h and fp8kit/block_scaling.h (the copy
// each layout reads, each element times its block's scale_inv), and one
// runner of fp8kit_gemm on the CPU or a GPU.
#ifndef FP8KIT_TESTS_CPP_BLOCK_GEMM_UTIL_H_
#define FP8KIT_TESTS_CPP_BLOCK_GEMM_UTIL_H_

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "block_test_util.h"
#include "fp8kit/fp8kit.h"
#include "quant_test_util.h"

namespace blockgemm {

using qtest::Buffer;

// A 2D block-scaled tensor [rows, cols] with both copies.
struct Operand {
  int64_t rows = 0, cols = 0;
  fp8kit_dtype fp8 = FP8KIT_E4M3;
  fp8kit_scaling_mode mode = FP8KIT_SCALING_BLOCK_1X128;
  blocktest::Copy rowwise, columnwise;

  // Element (r, c) of the tensor as dequantized from one copy.
  double value(int64_t r, int64_t c, bool from_columnwise) const {
    const blocktest::Copy& copy = from_columnwise ? columnwise : rowwise;
    const int64_t R = from_columnwise ? cols : rows, C = from_columnwise ? rows : cols;
    const int64_t i = from_columnwise ? c : r, j = from_columnwise ? r : c;
    const blocktest::ScaleShape ss = blocktest::model_scale_shape(mode, R, C);
    return qtest::decode_fp8(copy.data[size_t(i * C + j)], fp8) *
           double(copy.scales[size_t(blocktest::model_scale_index(mode, ss, i, j))]);
  }
};

// Normal values of standard deviation `sigma` with an outlier of 30 sigma
// every 97 elements, quantized on the CPU.
inline Operand make_operand(int64_t rows, int64_t cols, fp8kit_scaling_mode mode,
                            fp8kit_dtype fp8, uint32_t seed, float sigma = 1.0f) {
  std::vector<float> x = qtest::random_values(size_t(rows * cols), sigma, seed, false);
  for (size_t i = seed % 97; i < x.size(); i += 97) x[i] *= 30.0f;
  blocktest::Spec s;
  s.in_dtype = FP8KIT_FLOAT32;
  s.shape = {rows, cols};
  s.fp8 = fp8;
  s.mode = mode;
  s.config.power_2_scale = int(seed % 2);
  const blocktest::Result r =
      blocktest::run_quantize(FP8KIT_DEVICE_CPU, s, qtest::encode_input(x, FP8KIT_FLOAT32));
  EXPECT_EQ(r.status, FP8KIT_OK) << r.error;
  Operand op;
  op.rows = rows;
  op.cols = cols;
  op.fp8 = fp8;
  op.mode = mode;
  op.rowwise = r.rowwise;
  op.columnwise = r.columnwise;
  return op;
}

struct Case {
  Operand a, b;
  int trans_a = 0, trans_b = 1;
  fp8kit_dtype d_dtype = FP8KIT_BFLOAT16;
  float alpha = 1.0f, beta = 0.0f;
  bool bias = false;
  int use_split_accumulator = 1;
  fp8kit_epilogue epilogue = FP8KIT_EPILOGUE_DEFAULT;

  int64_t m() const { return trans_a ? a.cols : a.rows; }
  int64_t k() const { return trans_a ? a.rows : a.cols; }
  int64_t n() const { return trans_b ? b.rows : b.cols; }
};

// D's old contents (read when beta != 0) and the bias, exact in their dtypes.
inline std::vector<float> old_d(const Case& c) {
  std::vector<float> v = qtest::random_values(size_t(c.m() * c.n()), 4.0f, 77, false);
  for (float& x : v) x = qtest::decode_bf16(qtest::ref_to_bf16(x));
  return v;
}
inline std::vector<float> bias_values(const Case& c) {
  std::vector<float> v = qtest::random_values(size_t(c.n()), 2.0f, 78, false);
  for (float& x : v) x = qtest::decode_bf16(qtest::ref_to_bf16(x));
  return v;
}

// The float64 reference: A is read from its rowwise copy when trans_a == 0,
// B when trans_b == 1 (the K-contiguous copies), else from the columnwise
// copy. `sum_abs` gets sum_k |a||b| per element, the scale of rounding
// errors in the accumulation.
inline std::vector<double> reference(const Case& c, std::vector<double>* sum_abs) {
  const int64_t m = c.m(), n = c.n(), k = c.k();
  const std::vector<float> d0 = old_d(c), bias = bias_values(c);
  std::vector<double> a(size_t(m * k)), b(size_t(k * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t kk = 0; kk < k; ++kk) {
      a[size_t(i * k + kk)] = c.trans_a ? c.a.value(kk, i, true) : c.a.value(i, kk, false);
    }
  }
  for (int64_t kk = 0; kk < k; ++kk) {
    for (int64_t j = 0; j < n; ++j) {
      b[size_t(kk * n + j)] = c.trans_b ? c.b.value(j, kk, false) : c.b.value(kk, j, true);
    }
  }
  std::vector<double> d(size_t(m * n));
  sum_abs->assign(size_t(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0.0, mag = 0.0;
      for (int64_t kk = 0; kk < k; ++kk) {
        acc += a[size_t(i * k + kk)] * b[size_t(kk * n + j)];
        mag += std::fabs(a[size_t(i * k + kk)] * b[size_t(kk * n + j)]);
      }
      double v = double(c.alpha) * acc;
      if (c.beta != 0.0f) v += double(c.beta) * d0[size_t(i * n + j)];
      if (c.bias) v += bias[size_t(j)];
      d[size_t(i * n + j)] = v;
      (*sum_abs)[size_t(i * n + j)] = std::fabs(double(c.alpha)) * mag;
    }
  }
  return d;
}

// One operand's buffers on a device and its descriptor.
struct DeviceOperand {
  std::unique_ptr<Buffer> data, columnwise, scales, columnwise_scales;
  fp8kit_tensor t;

  DeviceOperand(fp8kit_device_type dev, const Operand& op) {
    auto up = [dev](const void* p, size_t bytes) {
      auto b = std::make_unique<Buffer>(dev, bytes);
      b->upload(p, bytes);
      return b;
    };
    data = up(op.rowwise.data.data(), op.rowwise.data.size());
    columnwise = up(op.columnwise.data.data(), op.columnwise.data.size());
    scales = up(op.rowwise.scales.data(), op.rowwise.scales.size() * 4);
    columnwise_scales = up(op.columnwise.scales.data(), op.columnwise.scales.size() * 4);
    t = qtest::make_tensor(dev, op.fp8, {op.rows, op.cols}, data->ptr());
    t.scaling_mode = op.mode;
    t.columnwise_data = columnwise->ptr();
    t.block_scale_inv = scales->fptr();
    t.columnwise_block_scale_inv = columnwise_scales->fptr();
  }
};

struct Run {
  fp8kit_status status = FP8KIT_INTERNAL;
  std::string error;
  std::vector<float> d;  // decoded
};

// fp8kit_gemm on `dev`; `edit` may break the descriptors or the config
// before the call (error tests).
template <typename Edit>
Run run(fp8kit_device_type dev, const Case& c, Edit edit) {
  DeviceOperand a(dev, c.a), b(dev, c.b);
  const int64_t m = c.m(), n = c.n();
  const size_t d_size = fp8kit_dtype_size(c.d_dtype);
  Buffer d(dev, size_t(m * n) * d_size), bias(dev, size_t(n) * 2);
  d.upload(qtest::encode_input(old_d(c), c.d_dtype).data(), size_t(m * n) * d_size);
  bias.upload(qtest::encode_input(bias_values(c), FP8KIT_BFLOAT16).data(), size_t(n) * 2);
  fp8kit_tensor td = qtest::make_tensor(dev, c.d_dtype, {m, n}, d.ptr());
  fp8kit_gemm_config config = fp8kit_gemm_config_default();
  config.trans_a = c.trans_a;
  config.trans_b = c.trans_b;
  config.alpha = c.alpha;
  config.beta = c.beta;
  config.use_split_accumulator = c.use_split_accumulator;
  config.epilogue = c.bias ? FP8KIT_EPILOGUE_BIAS : c.epilogue;
  config.bias = c.bias ? bias.ptr() : nullptr;
  config.bias_dtype = FP8KIT_BFLOAT16;
  config.bias_numel = c.bias ? n : 0;
  edit(a.t, b.t, td, config);
  Run r;
  r.status = fp8kit_gemm(&a.t, &b.t, &td, &config, nullptr);
  r.error = fp8kit_last_error();
  if (r.status != FP8KIT_OK) return r;
  const std::vector<uint8_t> bytes = d.download(size_t(m * n) * d_size);
  r.d.resize(size_t(m * n));
  for (size_t i = 0; i < r.d.size(); ++i) r.d[i] = qtest::input_value(bytes, c.d_dtype, i);
  return r;
}

inline Run run(fp8kit_device_type dev, const Case& c) {
  return run(dev, c, [](fp8kit_tensor&, fp8kit_tensor&, fp8kit_tensor&, fp8kit_gemm_config&) {});
}

// |got - want| <= rel * |want| + acc * sum_abs for every element.
inline void expect_close(const std::vector<float>& got, const std::vector<double>& want,
                         const std::vector<double>& sum_abs, double rel, double acc,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i) {
    const double tol = rel * std::fabs(want[i]) + acc * sum_abs[i] + 1e-30;
    if (!(std::fabs(double(got[i]) - want[i]) <= tol)) {
      ADD_FAILURE() << what << ": D[" << i << "] = " << got[i] << ", reference " << want[i]
                    << " (tolerance " << tol << ")";
      ++bad;
    }
  }
}

inline std::string case_name(const Case& c) {
  auto mode = [](fp8kit_scaling_mode m) {
    return m == FP8KIT_SCALING_BLOCK_1X128 ? "1x128" : "128x128";
  };
  return std::string("A ") + mode(c.a.mode) + (c.trans_a ? "^T" : "") + " x B " + mode(c.b.mode) +
         (c.trans_b ? "^T" : "") + " M=" + std::to_string(c.m()) + " N=" +
         std::to_string(c.n()) + " K=" + std::to_string(c.k()) + " D " +
         fp8kit_dtype_name(c.d_dtype) + (c.bias ? " +bias" : "") +
         (c.beta != 0.0f ? " beta" : "") + (c.alpha != 1.0f ? " alpha" : "");
}

// The training GEMMs of a Linear layer y = x w^T (x: [tokens, in] 1x128,
// w: [out, in] 128x128, dy: [tokens, out] 1x128), and 128x128 x 1x128.
inline std::vector<Case> layer_cases(int64_t tokens, int64_t in, int64_t out, uint32_t seed) {
  const auto e4m3 = FP8KIT_E4M3;
  const Operand x = make_operand(tokens, in, FP8KIT_SCALING_BLOCK_1X128, e4m3, seed);
  const Operand w = make_operand(out, in, FP8KIT_SCALING_BLOCK_128X128, e4m3, seed + 1, 0.05f);
  const Operand dy = make_operand(tokens, out, FP8KIT_SCALING_BLOCK_1X128, e4m3, seed + 2, 1e-3f);
  std::vector<Case> cases(4);
  cases[0].a = x;  // forward: y = x w^T
  cases[0].b = w;
  cases[0].trans_b = 1;
  cases[1].a = dy;  // dgrad: dx = dy w
  cases[1].b = w;
  cases[1].trans_b = 0;
  cases[2].a = dy;  // wgrad: dw = dy^T x
  cases[2].trans_a = 1;
  cases[2].b = x;
  cases[2].trans_b = 0;
  cases[3].a = w;  // 128x128 x 1x128: w x^T
  cases[3].b = x;
  cases[3].trans_b = 1;
  return cases;
}

}  // namespace blockgemm

#endif  // FP8KIT_TESTS_CPP_BLOCK_GEMM_UTIL_H_
