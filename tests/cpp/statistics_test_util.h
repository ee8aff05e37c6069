// Helpers of the cast statistics tests: FP8 copies made by the core's own
// quantize functions, a runner of fp8kit_cast_statistics_of on the CPU or a
// GPU, and an independent reference.
//
// Independence: the reference decodes FP8 codes with testref::decode_fp8,
// finds block scales by blocktest's index formulas, dequantizes with one
// double product rounded to float32 (exact for two floats, so the float32
// multiply's result) and sums in double. It shares no code with the core.
#ifndef FP8KIT_TESTS_CPP_STATISTICS_TEST_UTIL_H_
#define FP8KIT_TESTS_CPP_STATISTICS_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "block_test_util.h"
#include "fp8kit/fp8kit.h"
#include "quant_test_util.h"

namespace stattest {

using Shape = std::vector<int64_t>;

inline const fp8kit_scaling_mode kModes[] = {
    FP8KIT_SCALING_PER_TENSOR, FP8KIT_SCALING_BLOCK_1X128, FP8KIT_SCALING_BLOCK_128X128};
inline const fp8kit_dtype kFormats[] = {FP8KIT_E4M3, FP8KIT_E5M2};

inline const char* mode_name(fp8kit_scaling_mode mode) {
  return mode == FP8KIT_SCALING_PER_TENSOR    ? "per-tensor"
         : mode == FP8KIT_SCALING_BLOCK_1X128 ? "1x128"
                                              : "128x128";
}

// The input and both FP8 copies of it, as host bytes.
struct Case {
  fp8kit_dtype in_dtype = FP8KIT_FLOAT32;
  Shape shape;
  std::vector<uint8_t> input;
  fp8kit_dtype fp8 = FP8KIT_E4M3;
  fp8kit_scaling_mode mode = FP8KIT_SCALING_PER_TENSOR;
  std::vector<uint8_t> data, columnwise;         // stored [rows, cols] and [cols, rows]
  float scale_inv = 0.0f;                        // per-tensor
  std::vector<float> scales, columnwise_scales;  // block-scaled
  std::string name;
};

// Quantizes `x` on the CPU with fp8kit_quantize (per-tensor `scale`) or
// fp8kit_quantize_block_scaling, writing both copies.
inline Case make_case(fp8kit_dtype in_dtype, const Shape& shape, const std::vector<float>& x,
                      fp8kit_dtype fp8, fp8kit_scaling_mode mode, float scale = 1.0f) {
  Case c;
  c.in_dtype = in_dtype;
  c.shape = shape;
  c.input = qtest::encode_input(x, in_dtype);
  c.fp8 = fp8;
  c.mode = mode;
  std::string dims;
  for (int64_t d : shape) dims += (dims.empty() ? "" : "x") + std::to_string(d);
  c.name = std::string(fp8kit_dtype_name(in_dtype)) + "->" + fp8kit_dtype_name(fp8) + " " +
           mode_name(mode) + " [" + dims + "]";
  if (mode == FP8KIT_SCALING_PER_TENSOR) {
    qtest::QuantSpec s;
    s.in_dtype = in_dtype;
    s.shape = shape;
    s.fp8 = fp8;
    s.scale = scale;
    const qtest::QuantResult r = qtest::run_quantize(FP8KIT_DEVICE_CPU, s, c.input);
    EXPECT_EQ(r.status, FP8KIT_OK) << c.name << ": " << r.error;
    c.data = r.data;
    c.columnwise = r.columnwise;
    c.scale_inv = r.scale_inv;
  } else {
    blocktest::Spec s;
    s.in_dtype = in_dtype;
    s.shape = shape;
    s.fp8 = fp8;
    s.mode = mode;
    const blocktest::Result r = blocktest::run_quantize(FP8KIT_DEVICE_CPU, s, c.input);
    EXPECT_EQ(r.status, FP8KIT_OK) << c.name << ": " << r.error;
    c.data = r.rowwise.data;
    c.scales = r.rowwise.scales;
    c.columnwise = r.columnwise.data;
    c.columnwise_scales = r.columnwise.scales;
  }
  return c;
}

struct Stats {
  fp8kit_status status = FP8KIT_INTERNAL;
  std::string error;
  float amax = 0.0f;
  unsigned int underflow = 0, saturated = 0;
  float error_sq = 0.0f, norm_sq = 0.0f;
};

#ifdef FP8KIT_WITH_CUDA
// Runs `call` (which launches on the stream it is given) as XLA's command
// buffers do: captured from a stream into a graph, that graph nested as a
// child node of another, which is instantiated and launched once. Returns
// the call's status, or FP8KIT_CUDA_ERROR where CUDA refuses a step
// (as it refuses a child graph holding a stream-ordered allocation).
template <typename Call>
fp8kit_status run_in_child_graph(const Call& call) {
  cudaStream_t stream = nullptr;
  cudaGraph_t child = nullptr, parent = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaGraphNode_t node = nullptr;
  fp8kit_status status = FP8KIT_CUDA_ERROR;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess &&
      cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
    status = call(stream);
    if (cudaStreamEndCapture(stream, &child) != cudaSuccess) status = FP8KIT_CUDA_ERROR;
  }
  if (status == FP8KIT_OK &&
      (cudaGraphCreate(&parent, 0) != cudaSuccess ||
       cudaGraphAddChildGraphNode(&node, parent, nullptr, 0, child) != cudaSuccess ||
       cudaGraphInstantiate(&exec, parent, 0) != cudaSuccess ||
       cudaGraphLaunch(exec, stream) != cudaSuccess ||
       cudaStreamSynchronize(stream) != cudaSuccess)) {
    status = FP8KIT_CUDA_ERROR;
  }
  cudaGetLastError();  // a refused step leaves its error; the status says it
  if (exec) cudaGraphExecDestroy(exec);
  if (parent) cudaGraphDestroy(parent);
  if (child) cudaGraphDestroy(child);
  if (stream) cudaStreamDestroy(stream);
  return status;
}
#endif

// The five outputs and the workspace of one call on `dev`, and the Stats
// read back from them after it.
struct Outputs {
  qtest::Buffer amax, underflow, saturated, error_sq, norm_sq, workspace;
  fp8kit_cast_statistics out;

  explicit Outputs(fp8kit_device_type dev)
      : amax(dev, 4), underflow(dev, 4), saturated(dev, 4), error_sq(dev, 4), norm_sq(dev, 4),
        workspace(dev, FP8KIT_CAST_STATISTICS_WORKSPACE_BYTES),
        out{amax.fptr(),     static_cast<unsigned int*>(underflow.ptr()),
            static_cast<unsigned int*>(saturated.ptr()),
            error_sq.fptr(), norm_sq.fptr(),
            workspace.ptr()} {}

  Stats read(fp8kit_status status) {
    Stats s;
    s.status = status;
    s.error = fp8kit_last_error();
    if (s.status != FP8KIT_OK) return s;
    s.amax = amax.get_float();
    std::memcpy(&s.underflow, underflow.download(4).data(), 4);
    std::memcpy(&s.saturated, saturated.download(4).data(), 4);
    s.error_sq = error_sq.get_float();
    s.norm_sq = norm_sq.get_float();
    return s;
  }
};

// Uploads the case to `dev`, runs the op with outputs prefilled with garbage
// (so that an output left unwritten shows), downloads. `in_child_graph`
// (CUDA only): the op runs inside a nested CUDA graph (run_in_child_graph).
inline Stats run_stats(fp8kit_device_type dev, const Case& c, bool from_columnwise,
                       bool in_child_graph = false) {
  using qtest::Buffer;
  const size_t n = size_t(qtest::numel(c.shape));
  Buffer in(dev, c.input.size()), data(dev, n), columnwise(dev, n), scale_inv(dev, 4),
      scales(dev, c.scales.size() * 4), cw_scales(dev, c.columnwise_scales.size() * 4);
  in.upload(c.input.data(), c.input.size());
  data.upload(c.data.data(), c.data.size());
  columnwise.upload(c.columnwise.data(), c.columnwise.size());
  scale_inv.set_float(c.scale_inv);
  scales.upload(c.scales.data(), c.scales.size() * 4);
  cw_scales.upload(c.columnwise_scales.data(), c.columnwise_scales.size() * 4);
  fp8kit_tensor ti = qtest::make_tensor(dev, c.in_dtype, c.shape, in.ptr());
  fp8kit_tensor tq = qtest::make_tensor(dev, c.fp8, c.shape, data.ptr());
  tq.scaling_mode = c.mode;
  tq.columnwise_data = columnwise.ptr();
  if (c.mode == FP8KIT_SCALING_PER_TENSOR) {
    tq.scale_inv = scale_inv.fptr();
  } else {
    tq.block_scale_inv = scales.fptr();
    tq.columnwise_block_scale_inv = cw_scales.fptr();
  }
  Outputs outputs(dev);
  const auto call = [&](void* stream) {
    return fp8kit_cast_statistics_of(&ti, &tq, from_columnwise ? 1 : 0, &outputs.out, stream);
  };
#ifdef FP8KIT_WITH_CUDA
  return outputs.read(in_child_graph ? run_in_child_graph(call) : call(nullptr));
#else
  (void)in_child_graph;
  return outputs.read(call(nullptr));
#endif
}

struct Reference {
  double amax = 0.0;
  bool amax_nan = false;
  unsigned int underflow = 0, saturated = 0;
  double error_sq = 0.0, norm_sq = 0.0;
};

inline Reference reference(const Case& c, bool from_columnwise) {
  const auto [rows, cols] = qtest::flat2d(c.shape);
  const bool block = c.mode != FP8KIT_SCALING_PER_TENSOR;
  // The copy read, as stored: [R, C], its element (i, j) logical (r, c).
  const int64_t R = from_columnwise ? cols : rows, C = from_columnwise ? rows : cols;
  const blocktest::ScaleShape ss = blocktest::model_scale_shape(c.mode, R, C);
  const std::vector<float>& scales = from_columnwise ? c.columnwise_scales : c.scales;
  Reference ref;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t col = 0; col < cols; ++col) {
      const double x = qtest::input_value(c.input, c.in_dtype, size_t(r * cols + col));
      if (std::isnan(x)) ref.amax_nan = true;
      ref.amax = std::max(ref.amax, std::fabs(x));
      if (!std::isfinite(x)) continue;
      const int64_t i = from_columnwise ? col : r, j = from_columnwise ? r : col;
      const uint8_t q = (from_columnwise ? c.columnwise : c.data)[size_t(i * C + j)];
      const float s =
          block ? scales[size_t(blocktest::model_scale_index(c.mode, ss, i, j))] : c.scale_inv;
      const double v = testref::decode_fp8(q, c.fp8);
      if (v == 0.0 && x != 0.0) ++ref.underflow;
      if (std::fabs(v) == qtest::fp8_max_value(c.fp8)) ++ref.saturated;
      const double d = double(float(v * double(s)));
      ref.error_sq += (d - x) * (d - x);
      ref.norm_sq += x * x;
    }
  }
  return ref;
}

// A float32 sum against a double one: within `rel`, or the same inf / NaN.
inline void expect_sum(float got, double want, double rel, const std::string& what) {
  if (!std::isfinite(float(want))) {
    EXPECT_TRUE(qtest::same_float(got, float(want))) << what << ": " << got << " vs " << want;
    return;
  }
  EXPECT_LE(std::fabs(double(got) - want), rel * want) << what << ": " << got << " vs " << want;
}

inline void expect_matches_reference(const Case& c, bool from_columnwise) {
  const std::string what = c.name + (from_columnwise ? " columnwise" : " rowwise");
  const Stats s = run_stats(FP8KIT_DEVICE_CPU, c, from_columnwise);
  ASSERT_EQ(s.status, FP8KIT_OK) << what << ": " << s.error;
  const Reference ref = reference(c, from_columnwise);
  if (ref.amax_nan) {
    EXPECT_EQ(qtest::float_bits(s.amax), 0x7fc00000u) << what << ": amax " << s.amax;
  } else {
    EXPECT_EQ(double(s.amax), ref.amax) << what;
  }
  EXPECT_EQ(s.underflow, ref.underflow) << what;
  EXPECT_EQ(s.saturated, ref.saturated) << what;
  // Both sum in double; the float32 rounding is the difference.
  expect_sum(s.error_sq, ref.error_sq, 1e-6, what + ": error_sq");
  expect_sum(s.norm_sq, ref.norm_sq, 1e-6, what + ": norm_sq");
}

// Smallest subnormal of the format.
inline float min_subnormal(fp8kit_dtype fp8) { return fp8 == FP8KIT_E4M3 ? 0x1p-9f : 0x1p-16f; }

}  // namespace stattest

#endif  // FP8KIT_TESTS_CPP_STATISTICS_TEST_UTIL_H_
