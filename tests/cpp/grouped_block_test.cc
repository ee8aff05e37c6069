// Block-scaled grouped ops (fp8kit/grouped.h, the padded row layout):
// each group equal to the single-tensor op on its own rows, the layout of
// the copies and of their scale arrays (offsets found here independently
// with fp8kit_block_scale_inv_shape), the unused rows and floats zeroed,
// the scale bound, and both GEMM kinds against one fp8kit_gemm per group.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "fp8kit/fp8kit.h"

namespace {

constexpr int64_t kMultiple = FP8KIT_GEMM_DIM_MULTIPLE;

int64_t padded(int64_t m) { return (m + kMultiple - 1) / kMultiple * kMultiple; }

int64_t scale_floats(int64_t rows, int64_t cols, fp8kit_scaling_mode mode, int columnwise) {
  fp8kit_tensor t = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_E4M3, 0, nullptr, nullptr);
  t.rank = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  t.scaling_mode = mode;
  int64_t shape[2];
  EXPECT_EQ(fp8kit_block_scale_inv_shape(&t, columnwise, shape), FP8KIT_OK);
  return shape[0] * shape[1];
}

// A block-quantized padded grouped tensor on the CPU.
struct Grouped {
  std::vector<int64_t> sizes;
  int64_t rows, features;
  fp8kit_scaling_mode mode;
  std::vector<float> input;  // [rows, features], zero rows as padding
  std::vector<uint8_t> data, columnwise;
  std::vector<float> scales, columnwise_scales;
};

Grouped make_grouped(std::vector<int64_t> sizes, int64_t features, fp8kit_scaling_mode mode,
                     uint32_t seed, int64_t extra_rows = 16) {
  Grouped g{sizes, 0, features, mode, {}, {}, {}, {}, {}};
  int64_t used = 0;
  for (int64_t m : sizes) used += padded(m);
  g.rows = used + extra_rows;
  g.input.assign(size_t(g.rows * features), 0.0f);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  int64_t first = 0;
  for (int64_t m : sizes) {
    for (int64_t i = 0; i < m * features; ++i) g.input[size_t(first * features + i)] = normal(rng);
    first += padded(m);
  }
  const int64_t e = int64_t(sizes.size());
  g.data.assign(size_t(g.rows * features), 0xCD);
  g.columnwise.assign(size_t(g.rows * features), 0xCD);
  g.scales.assign(size_t(fp8kit_grouped_block_scales_floats(g.rows, e, features, mode, 0)), -1);
  g.columnwise_scales.assign(
      size_t(fp8kit_grouped_block_scales_floats(g.rows, e, features, mode, 1)), -1);
  const int64_t shape[2] = {g.rows, features};
  fp8kit_tensor in = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_FLOAT32, 2, shape,
                                        g.input.data());
  fp8kit_tensor out = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_E4M3, 2, shape,
                                         g.data.data());
  out.scaling_mode = mode;
  out.block_scale_inv = g.scales.data();
  out.columnwise_data = g.columnwise.data();
  out.columnwise_block_scale_inv = g.columnwise_scales.data();
  const int64_t e_shape[1] = {e};
  fp8kit_tensor gs = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_INT64, 1, e_shape,
                                        g.sizes.data());
  const fp8kit_current_scaling_config config{0.0f, 1};
  EXPECT_EQ(fp8kit_grouped_quantize_block(&in, &gs, &out, &config, nullptr), FP8KIT_OK)
      << fp8kit_last_error();
  return g;
}

TEST(GroupedBlock, EachGroupIsTheBlockQuantizationOfItsPaddedRows) {
  for (fp8kit_scaling_mode mode : {FP8KIT_SCALING_BLOCK_1X128, FP8KIT_SCALING_BLOCK_128X128}) {
    const Grouped g = make_grouped({130, 0, 5, 256}, 160, mode, 1);
    int64_t first = 0, row_off = 0, col_off = 0;
    for (int64_t m : g.sizes) {
      const int64_t p = padded(m);
      if (p == 0) continue;
      const int64_t shape[2] = {p, g.features};
      std::vector<uint8_t> data(size_t(p * g.features)), cw(size_t(p * g.features));
      std::vector<float> s(size_t(scale_floats(p, g.features, mode, 0)));
      std::vector<float> cs(size_t(scale_floats(p, g.features, mode, 1)));
      fp8kit_tensor in = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_FLOAT32, 2, shape,
                                            const_cast<float*>(&g.input[size_t(first * g.features)]));
      fp8kit_tensor out = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_E4M3, 2, shape,
                                             data.data());
      out.scaling_mode = mode;
      out.block_scale_inv = s.data();
      out.columnwise_data = cw.data();
      out.columnwise_block_scale_inv = cs.data();
      const fp8kit_current_scaling_config config{0.0f, 1};
      ASSERT_EQ(fp8kit_quantize_block_scaling(&in, &out, &config, nullptr), FP8KIT_OK);
      EXPECT_EQ(0, std::memcmp(data.data(), &g.data[size_t(first * g.features)], data.size()));
      EXPECT_EQ(0, std::memcmp(cw.data(), &g.columnwise[size_t(first * g.features)], cw.size()));
      EXPECT_EQ(0, std::memcmp(s.data(), &g.scales[size_t(row_off)], s.size() * 4));
      EXPECT_EQ(0, std::memcmp(cs.data(), &g.columnwise_scales[size_t(col_off)], cs.size() * 4));
      first += p;
      row_off += int64_t(s.size());
      col_off += int64_t(cs.size());
    }
    for (size_t i = size_t(first * g.features); i < g.data.size(); ++i) {
      ASSERT_EQ(g.data[i], 0) << "row after the groups";
      ASSERT_EQ(g.columnwise[i], 0) << "columnwise after the groups";
    }
    for (size_t i = size_t(row_off); i < g.scales.size(); ++i) ASSERT_EQ(g.scales[i], 0.0f);
    for (size_t i = size_t(col_off); i < g.columnwise_scales.size(); ++i) {
      ASSERT_EQ(g.columnwise_scales[i], 0.0f);
    }
  }
}

TEST(GroupedBlock, ScaleBoundHoldsForAnySizes) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t e = 1 + int64_t(rng() % 9), features = 16 * (1 + int64_t(rng() % 20));
    int64_t rows = 0;
    std::vector<int64_t> p(static_cast<size_t>(e));
    for (auto& v : p) rows += (v = 16 * int64_t(rng() % 40));
    for (auto mode : {FP8KIT_SCALING_BLOCK_1X128, FP8KIT_SCALING_BLOCK_128X128}) {
      for (int cw : {0, 1}) {
        int64_t sum = 0;
        for (int64_t v : p) sum += v ? scale_floats(v, features, mode, cw) : 0;
        ASSERT_LE(sum, fp8kit_grouped_block_scales_floats(rows, e, features, mode, cw));
      }
    }
  }
}

TEST(GroupedBlock, RefusesSizesWhosePaddingDoesNotFit) {
  Grouped g = make_grouped({20}, 32, FP8KIT_SCALING_BLOCK_1X128, 2, 0);  // rows = 32
  std::vector<int64_t> sizes = {20, 5};  // 32 + 16 padded rows > 32
  const int64_t shape[2] = {g.rows, g.features}, e_shape[1] = {2};
  fp8kit_tensor in = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_FLOAT32, 2, shape,
                                        g.input.data());
  fp8kit_tensor out = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_E4M3, 2, shape,
                                         g.data.data());
  out.scaling_mode = FP8KIT_SCALING_BLOCK_1X128;
  out.block_scale_inv = g.scales.data();
  fp8kit_tensor gs = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_INT64, 1, e_shape,
                                        sizes.data());
  const fp8kit_current_scaling_config config{0.0f, 1};
  EXPECT_EQ(fp8kit_grouped_quantize_block(&in, &gs, &out, &config, nullptr),
            FP8KIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fp8kit_last_error()).find("padded"), std::string::npos);
}

// One block-scaled fp8kit_gemm on explicit views, for the per-group checks.
std::vector<float> single_gemm(fp8kit_tensor a, fp8kit_tensor b, int64_t m, int64_t n,
                               int trans_a, int trans_b) {
  std::vector<float> d(size_t(m * n), -7.0f);
  const int64_t shape[2] = {m, n};
  fp8kit_tensor dt = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_FLOAT32, 2, shape, d.data());
  fp8kit_gemm_config c = fp8kit_gemm_config_default();
  c.trans_a = trans_a;
  c.trans_b = trans_b;
  EXPECT_EQ(fp8kit_gemm(&a, &b, &dt, &c, nullptr), FP8KIT_OK) << fp8kit_last_error();
  return d;
}

fp8kit_tensor view(int64_t rows, int64_t cols, fp8kit_scaling_mode mode) {
  const int64_t shape[2] = {rows, cols};
  fp8kit_tensor t = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_E4M3, 2, shape, nullptr);
  t.scaling_mode = mode;
  return t;
}

TEST(GroupedBlock, GemmsAreOneBlockGemmPerGroup) {
  const std::vector<int64_t> sizes = {21, 0, 130};
  const int64_t e = 3, k = 128, n = 64;
  Grouped x = make_grouped(sizes, k, FP8KIT_SCALING_BLOCK_1X128, 4);
  Grouped dy = make_grouped(sizes, n, FP8KIT_SCALING_BLOCK_1X128, 5);
  Grouped w = make_grouped(std::vector<int64_t>(size_t(e), n), k, FP8KIT_SCALING_BLOCK_128X128,
                           6, 0);
  const int64_t e_shape[1] = {e};
  std::vector<int64_t> gsizes = sizes;
  fp8kit_tensor gs = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_INT64, 1, e_shape,
                                        gsizes.data());
  // Forward: y [rows, n] = x_g @ w_g^T per group, in the padded layout.
  fp8kit_tensor a = view(x.rows, k, FP8KIT_SCALING_BLOCK_1X128);
  a.data = x.data.data();
  a.block_scale_inv = x.scales.data();
  const int64_t b_shape[3] = {e, n, k};
  fp8kit_tensor b = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_E4M3, 3, b_shape,
                                       w.data.data());
  b.scaling_mode = FP8KIT_SCALING_BLOCK_128X128;
  b.block_scale_inv = w.scales.data();
  std::vector<float> y(size_t(x.rows * n), -7.0f);
  const int64_t y_shape[2] = {x.rows, n};
  fp8kit_tensor yt = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_FLOAT32, 2, y_shape,
                                        y.data());
  const fp8kit_grouped_gemm_config config{1, nullptr, FP8KIT_BFLOAT16, 1};
  ASSERT_EQ(fp8kit_grouped_gemm(FP8KIT_GROUPED_GEMM_TOKENS, &a, &b, &yt, &gs, &config, nullptr),
            FP8KIT_OK)
      << fp8kit_last_error();
  // wgrad: dw [e, n, k] = dy_g^T @ x_g over each group's padded tokens.
  fp8kit_tensor ca = view(dy.rows, n, FP8KIT_SCALING_BLOCK_1X128);
  ca.columnwise_data = dy.columnwise.data();
  ca.columnwise_block_scale_inv = dy.columnwise_scales.data();
  fp8kit_tensor cb = view(x.rows, k, FP8KIT_SCALING_BLOCK_1X128);
  cb.columnwise_data = x.columnwise.data();
  cb.columnwise_block_scale_inv = x.columnwise_scales.data();
  std::vector<float> dw(size_t(e * n * k), -7.0f);
  const int64_t dw_shape[3] = {e, n, k};
  fp8kit_tensor dwt = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_FLOAT32, 3, dw_shape,
                                         dw.data());
  const fp8kit_grouped_gemm_config contract{0, nullptr, FP8KIT_BFLOAT16, 1};
  ASSERT_EQ(fp8kit_grouped_gemm(FP8KIT_GROUPED_GEMM_CONTRACT_TOKENS, &ca, &cb, &dwt, &gs,
                                &contract, nullptr),
            FP8KIT_OK)
      << fp8kit_last_error();
  int64_t first = 0, xs = 0, xcs = 0, dycs = 0;
  const int64_t wr = scale_floats(n, k, FP8KIT_SCALING_BLOCK_128X128, 0);
  for (int64_t g = 0; g < e; ++g) {
    const int64_t p = padded(sizes[g]);
    if (p == 0) {
      for (int64_t i = 0; i < n * k; ++i) ASSERT_EQ(dw[size_t(g * n * k + i)], 0.0f);
      continue;
    }
    fp8kit_tensor ag = view(p, k, FP8KIT_SCALING_BLOCK_1X128);
    ag.data = &x.data[size_t(first * k)];
    ag.block_scale_inv = &x.scales[size_t(xs)];
    fp8kit_tensor bg = view(n, k, FP8KIT_SCALING_BLOCK_128X128);
    bg.data = &w.data[size_t(g * n * k)];
    bg.block_scale_inv = &w.scales[size_t(g * wr)];
    const std::vector<float> want = single_gemm(ag, bg, p, n, 0, 1);
    ASSERT_EQ(0, std::memcmp(want.data(), &y[size_t(first * n)], want.size() * 4)) << g;
    fp8kit_tensor dg = view(p, n, FP8KIT_SCALING_BLOCK_1X128);
    dg.columnwise_data = &dy.columnwise[size_t(first * n)];
    dg.columnwise_block_scale_inv = &dy.columnwise_scales[size_t(dycs)];
    fp8kit_tensor xg = view(p, k, FP8KIT_SCALING_BLOCK_1X128);
    xg.columnwise_data = &x.columnwise[size_t(first * k)];
    xg.columnwise_block_scale_inv = &x.columnwise_scales[size_t(xcs)];
    const std::vector<float> dw_want = single_gemm(dg, xg, n, k, 1, 0);
    ASSERT_EQ(0, std::memcmp(dw_want.data(), &dw[size_t(g * n * k)], dw_want.size() * 4)) << g;
    first += p;
    xs += scale_floats(p, k, FP8KIT_SCALING_BLOCK_1X128, 0);
    xcs += scale_floats(p, k, FP8KIT_SCALING_BLOCK_1X128, 1);
    dycs += scale_floats(p, n, FP8KIT_SCALING_BLOCK_1X128, 1);
  }
  for (size_t i = size_t(first * n); i < y.size(); ++i) {
    ASSERT_EQ(y[i], 0.0f) << "rows after the groups are zeroed";
  }
}

}  // namespace
