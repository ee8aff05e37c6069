// fp8kit_activation_forward / fp8kit_activation_backward on CUDA against
// the CPU reference, over GELU and SwiGLU, every input dtype, both recipes
// (fresh and seeded slots, recording or not), tile-border shapes (F not a
// multiple of the 128-column tile, so SwiGLU's halves meet inside a tile),
// specials in h, and two calls in a row on one state. The kernels' sigmoid
// is the special function unit's (fp8kit/activation.h), so:
//   - float32 values (the high-precision output) within the documented
//     bound of the CPU reference's: 2^-18 |v| + 2^-20 amax;
//   - FP8 bytes equal or one step apart, on a small fraction of elements;
//     the scaling state within the same relative bound;
//   - the cast itself exact: the GPU's float32 values cast by the CPU
//     reference with the same state give the GPU's FP8 bytes, state and
//     column sums bit for bit.
// Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include "activation_test_util.h"
#include "fp8kit/fp8kit.h"
#include "fused_cast_util.h"
#include "quant_test_util.h"

namespace {

const std::vector<std::vector<int64_t>> kGpuShapes = {
    {3, 5, 48}, {130, 144}, {257, 4096}, {129, 272}, {16, 14336}, {0, 32}, {1, 16}};

// The bound of fp8kit/activation.h.
constexpr double kRelBound = 0x1p-18;
constexpr double kAmaxBound = 0x1p-20;

std::vector<float> decoded(const std::vector<uint8_t>& bytes, fp8kit_dtype dtype) {
  const size_t n = bytes.size() / fp8kit_dtype_size(dtype);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = qtest::input_value(bytes, dtype, i);
  return v;
}

// Half an ulp of `dtype` at |x| (0 for float32): a value within the bound
// may round to either neighbour.
double rounding_slack(double x, fp8kit_dtype dtype) {
  if (dtype == FP8KIT_FLOAT32) return 0.0;
  const int bits = dtype == FP8KIT_BFLOAT16 ? 8 : 11;
  const double floor = dtype == FP8KIT_BFLOAT16 ? 0x1p-133 : 0x1p-24;
  return std::max(std::fabs(x) * std::ldexp(1.0, 1 - bits), floor);
}

// Largest finite |v|.
double finite_amax(const std::vector<float>& v) {
  double m = 0.0;
  for (float x : v) {
    if (std::isfinite(x)) m = std::max(m, double(std::fabs(x)));
  }
  return m;
}

// The largest errors seen, printed at the end: relative to |v| (where |v|
// >= amax / 16) and to amax, for the bound's documentation.
struct Observed {
  double relative = 0.0, to_amax = 0.0;
};

void expect_within_bound(const std::vector<float>& cpu, const std::vector<float>& gpu,
                         fp8kit_dtype dtype, const std::string& what, Observed& seen) {
  ASSERT_EQ(cpu.size(), gpu.size()) << what;
  const double amax = finite_amax(cpu);
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (!std::isfinite(cpu[i]) || !std::isfinite(gpu[i])) {
      EXPECT_TRUE((std::isnan(cpu[i]) && std::isnan(gpu[i])) || cpu[i] == gpu[i])
          << what << ": element " << i << " cpu " << cpu[i] << " gpu " << gpu[i];
      continue;
    }
    const double c = cpu[i];
    const double err = std::fabs(double(gpu[i]) - c);
    const double bound = kRelBound * std::fabs(c) + kAmaxBound * amax + rounding_slack(c, dtype);
    if (dtype == FP8KIT_FLOAT32 && amax > 0) {
      seen.to_amax = std::max(seen.to_amax, err / amax);
      if (std::fabs(c) >= amax / 16) seen.relative = std::max(seen.relative, err / std::fabs(c));
    }
    EXPECT_LE(err, bound) << what << ": element " << i << " cpu " << c << " gpu " << gpu[i];
  }
}

// FP8 codes equal, or one step apart with the same sign.
void expect_fp8_near(const std::vector<uint8_t>& cpu, const std::vector<uint8_t>& gpu,
                     const std::string& what) {
  ASSERT_EQ(cpu.size(), gpu.size()) << what;
  size_t differ = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (cpu[i] == gpu[i]) continue;
    ++differ;
    const int mc = cpu[i] & 0x7f, mg = gpu[i] & 0x7f;
    const bool same_sign = (cpu[i] & 0x80) == (gpu[i] & 0x80) || (mc == 0 && mg == 0);
    EXPECT_TRUE(same_sign && std::abs(mc - mg) <= 1)
        << what << ": element " << i << " cpu 0x" << std::hex << int(cpu[i]) << " gpu 0x"
        << int(gpu[i]);
  }
  EXPECT_LE(differ, 1 + cpu.size() / 100) << what << ": " << differ << " of " << cpu.size()
                                          << " FP8 bytes differ";
}

void expect_near_float(float cpu, float gpu, const std::string& what) {
  if (std::isnan(cpu) || std::isinf(cpu)) {
    EXPECT_TRUE((std::isnan(cpu) && std::isnan(gpu)) || cpu == gpu) << what;
    return;
  }
  EXPECT_LE(std::fabs(double(gpu) - double(cpu)), 4 * kRelBound * std::fabs(double(cpu)))
      << what << ": cpu " << cpu << " gpu " << gpu;
}

void expect_near_cast(const fusedtest::CastResult& cpu, const fusedtest::CastResult& gpu,
                      const std::vector<float>& cpu_values, int64_t rows, fp8kit_dtype sums_dtype,
                      const std::string& what) {
  expect_fp8_near(cpu.data, gpu.data, what + ": rowwise FP8");
  expect_fp8_near(cpu.columnwise, gpu.columnwise, what + ": columnwise FP8");
  EXPECT_EQ(cpu.sums_counters, gpu.sums_counters) << what << ": column-sum counters";
  if (!cpu.sums.empty()) {
    // Each column's sum within the bound of the sum of its magnitudes.
    const std::vector<float> c = decoded(cpu.sums, sums_dtype), g = decoded(gpu.sums, sums_dtype);
    const size_t cols = c.size();
    const double amax = finite_amax(cpu_values);
    for (size_t j = 0; j < cols; ++j) {
      double magnitude = 0.0;
      for (int64_t r = 0; r < rows; ++r) magnitude += std::fabs(cpu_values[size_t(r) * cols + j]);
      if (!std::isfinite(magnitude)) continue;
      const double bound = 2 * (kRelBound * magnitude + kAmaxBound * amax * double(rows)) +
                           rounding_slack(c[j], sums_dtype);
      EXPECT_LE(std::fabs(double(g[j]) - double(c[j])), bound)
          << what << ": column sum " << j << " cpu " << c[j] << " gpu " << g[j];
    }
  }
  expect_near_float(cpu.out_scale, gpu.out_scale, what + ": scale");
  expect_near_float(cpu.out_scale_inv, gpu.out_scale_inv, what + ": scale_inv");
  expect_near_float(cpu.out_amax, gpu.out_amax, what + ": amax");
  ASSERT_EQ(cpu.history.size(), gpu.history.size()) << what;
  for (size_t i = 0; i < cpu.history.size(); ++i) {
    expect_near_float(cpu.history[i], gpu.history[i], what + ": history[" + std::to_string(i) + "]");
  }
  expect_near_float(cpu.amax, gpu.amax, what + ": state amax");
  expect_near_float(cpu.scale, gpu.scale, what + ": state scale");
  expect_near_float(cpu.scale_inv, gpu.scale_inv, what + ": state scale_inv");
  EXPECT_EQ(qtest::float_bits(cpu.seeded), qtest::float_bits(gpu.seeded)) << what << ": seeded";
  EXPECT_EQ(cpu.counter, gpu.counter) << what << ": counter";
}

TEST(ActivationGpu, WithinBoundOfCpu) {
  QTEST_SKIP_WITHOUT_GPU();
  uint32_t seed = 200;
  Observed seen;
  for (fp8kit_activation act : {FP8KIT_GELU, FP8KIT_SWIGLU}) {
    for (bool backward : {false, true}) {
      for (fp8kit_dtype dtype : {FP8KIT_FLOAT32, FP8KIT_BFLOAT16, FP8KIT_FLOAT16}) {
        for (const auto& shape : kGpuShapes) {
          for (fusedtest::CastSpec spec : fusedtest::cast_specs()) {
            const int64_t rows = qtest::flat2d(shape).first;
            spec.sums = backward && spec.columnwise && rows > 1;
            spec.sums_dtype = dtype;
            const uint32_t case_seed = seed++;
            const acttest::ActInputs in = acttest::make_inputs(act, dtype, shape, case_seed,
                                                               /*specials=*/case_seed % 3 == 0);
            const std::string what = std::string(act == FP8KIT_GELU ? "GELU " : "SwiGLU ") +
                                     (backward ? "backward " : "forward ") +
                                     fp8kit_dtype_name(dtype) + " " + fusedtest::spec_name(spec) +
                                     " numel " + std::to_string(qtest::numel(shape));
            const acttest::ActResult cpu = acttest::run(FP8KIT_DEVICE_CPU, in, backward, spec, 2);
            const acttest::ActResult gpu = acttest::run(FP8KIT_DEVICE_CUDA, in, backward, spec, 2);
            ASSERT_EQ(cpu.status, FP8KIT_OK) << what << ": " << cpu.error;
            ASSERT_EQ(gpu.status, FP8KIT_OK) << what << ": " << gpu.error;
            const std::vector<float> cpu_values = decoded(cpu.hp, dtype);
            expect_within_bound(cpu_values, decoded(gpu.hp, dtype), dtype,
                                what + ": high-precision output", seen);
            expect_near_cast(cpu.cast, gpu.cast, cpu_values, rows, dtype, what);
          }
        }
      }
    }
  }
  std::cout << "activation GPU vs CPU, float32: largest error " << seen.relative
            << " of |v| (|v| >= amax / 16), " << seen.to_amax << " of amax\n";
}

// Without a cast the values pass writes the high-precision output alone:
// the bits the casting kernel writes beside its FP8 copies.
TEST(ActivationGpu, WithoutCastEqualsTheCastingKernel) {
  QTEST_SKIP_WITHOUT_GPU();
  uint32_t seed = 700;
  for (fp8kit_activation act : {FP8KIT_GELU, FP8KIT_SWIGLU}) {
    for (bool backward : {false, true}) {
      for (fp8kit_dtype dtype : {FP8KIT_FLOAT32, FP8KIT_BFLOAT16, FP8KIT_FLOAT16}) {
        for (const auto& shape : kGpuShapes) {
          const uint32_t case_seed = seed++;
          const acttest::ActInputs in = acttest::make_inputs(act, dtype, shape, case_seed,
                                                             /*specials=*/case_seed % 3 == 0);
          const std::string what = std::string(act == FP8KIT_GELU ? "GELU " : "SwiGLU ") +
                                   (backward ? "backward " : "forward ") +
                                   fp8kit_dtype_name(dtype) + " numel " +
                                   std::to_string(qtest::numel(shape));
          const fusedtest::CastSpec spec;
          const acttest::ActResult cast = acttest::run(FP8KIT_DEVICE_CUDA, in, backward, spec);
          const acttest::ActResult plain =
              acttest::run(FP8KIT_DEVICE_CUDA, in, backward, spec, 1, /*cast_output=*/false);
          ASSERT_EQ(cast.status, FP8KIT_OK) << what << ": " << cast.error;
          ASSERT_EQ(plain.status, FP8KIT_OK) << what << ": " << plain.error;
          EXPECT_EQ(plain.hp, cast.hp) << what;
        }
      }
    }
  }
}

TEST(ActivationGpu, CastOfGpuValuesIsExact) {
  QTEST_SKIP_WITHOUT_GPU();
  uint32_t seed = 900;
  for (fp8kit_activation act : {FP8KIT_GELU, FP8KIT_SWIGLU}) {
    for (bool backward : {false, true}) {
      for (const auto& shape : kGpuShapes) {
        for (fusedtest::CastSpec spec : fusedtest::cast_specs()) {
          spec.sums = backward && spec.columnwise && qtest::flat2d(shape).first > 1;
          const uint32_t case_seed = seed++;
          const acttest::ActInputs in = acttest::make_inputs(act, FP8KIT_FLOAT32, shape, case_seed,
                                                             /*specials=*/case_seed % 3 == 0);
          const std::string what = std::string(act == FP8KIT_GELU ? "GELU " : "SwiGLU ") +
                                   (backward ? "backward " : "forward ") +
                                   fusedtest::spec_name(spec) + " numel " +
                                   std::to_string(qtest::numel(shape));
          const acttest::ActResult gpu = acttest::run(FP8KIT_DEVICE_CUDA, in, backward, spec, 1);
          ASSERT_EQ(gpu.status, FP8KIT_OK) << what << ": " << gpu.error;
          const std::vector<int64_t>& out_shape = backward ? in.h_shape : in.a_shape;
          const fusedtest::CastResult want =
              fusedtest::reference_cast(spec, out_shape, decoded(gpu.hp, FP8KIT_FLOAT32));
          fusedtest::expect_same_cast(want, gpu.cast, what + ": GPU values cast on the CPU");
        }
      }
    }
  }
}

}  // namespace
