// fp8kit_columnwise_from_rowwise: the columnwise copy as the byte transpose
// of the rowwise data, against a transpose computed here, on the CPU and on
// CUDA (full and edge tiles, aligned and misaligned buffers, so both paths
// of the kernel run), the bytes around the output untouched, and errors.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "fp8kit/fp8kit.h"
#include "quant_test_util.h"

namespace {

struct TransposeResult {
  fp8kit_status status;
  std::string error;
  std::vector<uint8_t> columnwise;  // with `guard` bytes either side
};

constexpr size_t kGuard = 8;

TransposeResult run_transpose(fp8kit_device_type dev, fp8kit_dtype fp8,
                              const std::vector<int64_t>& shape,
                              const std::vector<uint8_t>& data, size_t offset = 0) {
  const size_t n = data.size();
  qtest::Buffer in(dev, n, offset), out(dev, n + 2 * kGuard, offset);
  in.upload(data.data(), n);
  fp8kit_tensor t = qtest::make_tensor(dev, fp8, shape, in.ptr());
  t.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  t.columnwise_data = static_cast<uint8_t*>(out.ptr()) + kGuard;
  TransposeResult r;
  r.status = fp8kit_columnwise_from_rowwise(&t, nullptr);
  r.error = fp8kit_last_error();
  r.columnwise = out.download(n + 2 * kGuard);
  return r;
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> q(n);
  std::mt19937 rng(seed);
  for (auto& b : q) b = uint8_t(rng());
  return q;
}

// What the columnwise buffer should hold: the guard bytes as Buffer fills
// them (0xCD), then [cols, rows] of data's [rows, cols] view, then guard.
std::vector<uint8_t> expected(const std::vector<int64_t>& shape, const std::vector<uint8_t>& q) {
  const auto [rows, cols] = qtest::flat2d(shape);
  std::vector<uint8_t> want(q.size() + 2 * kGuard, 0xCD);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) want[kGuard + size_t(c * rows + r)] = q[size_t(r * cols + c)];
  }
  return want;
}

const std::vector<std::vector<int64_t>> kShapes = {
    {}, {1}, {7}, {4, 4}, {3, 5, 7}, {64, 64}, {128, 192}, {100, 257}, {65, 63}, {1, 300},
    {300, 1}, {2, 64, 128}, {256, 1028}};

TEST(ColumnwiseFromRowwise, TransposesTheBytes) {
  uint32_t seed = 1;
  for (const auto& shape : kShapes) {
    const std::vector<uint8_t> q = random_bytes(size_t(qtest::numel(shape)), seed++);
    for (fp8kit_dtype fp8 : {FP8KIT_E4M3, FP8KIT_E5M2}) {
      const TransposeResult r = run_transpose(FP8KIT_DEVICE_CPU, fp8, shape, q);
      ASSERT_EQ(r.status, FP8KIT_OK) << r.error;
      EXPECT_EQ(r.columnwise, expected(shape, q)) << "numel " << q.size();
    }
  }
}

TEST(ColumnwiseFromRowwise, EmptyWritesNothing) {
  const TransposeResult r = run_transpose(FP8KIT_DEVICE_CPU, FP8KIT_E4M3, {0, 16}, {});
  ASSERT_EQ(r.status, FP8KIT_OK) << r.error;
  EXPECT_EQ(r.columnwise, std::vector<uint8_t>(2 * kGuard, 0xCD));
}

TEST(ColumnwiseFromRowwise, Errors) {
  std::vector<uint8_t> in(16), out(16);
  const std::vector<int64_t> shape = {4, 4};
  auto expect = [&](fp8kit_tensor t, const std::string& needle) {
    EXPECT_EQ(fp8kit_columnwise_from_rowwise(&t, nullptr), FP8KIT_INVALID_ARGUMENT);
    EXPECT_NE(std::string(fp8kit_last_error()).find(needle), std::string::npos)
        << fp8kit_last_error();
  };
  fp8kit_tensor t = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_E4M3, shape, in.data());
  t.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  t.columnwise_data = out.data();
  fp8kit_tensor bad = t;
  bad.dtype = FP8KIT_BFLOAT16;
  expect(bad, "expected e4m3 or e5m2");
  bad = t;
  bad.scaling_mode = FP8KIT_SCALING_BLOCK_1X128;
  expect(bad, "block-scaled");
  bad = t;
  bad.columnwise_data = nullptr;
  expect(bad, "tensor->columnwise_data is NULL");
  bad = t;
  bad.columnwise_data = in.data();
  expect(bad, "needs its own buffer");
  bad = t;
  bad.data = nullptr;
  expect(bad, "data pointer is NULL");
  EXPECT_EQ(fp8kit_columnwise_from_rowwise(nullptr, nullptr), FP8KIT_INVALID_ARGUMENT);
}

#ifdef FP8KIT_WITH_CUDA

TEST(ColumnwiseFromRowwiseGpu, EqualsCpu) {
  QTEST_SKIP_WITHOUT_GPU();
  uint32_t seed = 100;
  std::vector<std::vector<int64_t>> shapes = kShapes;
  shapes.push_back({1024, 2048});  // many full tiles
  for (const auto& shape : shapes) {
    const std::vector<uint8_t> q = random_bytes(size_t(qtest::numel(shape)), seed++);
    for (size_t offset : {size_t(0), size_t(1)}) {  // 4-byte words, then single bytes
      const TransposeResult c = run_transpose(FP8KIT_DEVICE_CPU, FP8KIT_E5M2, shape, q, offset);
      const TransposeResult g = run_transpose(FP8KIT_DEVICE_CUDA, FP8KIT_E5M2, shape, q, offset);
      ASSERT_EQ(g.status, FP8KIT_OK) << g.error;
      EXPECT_EQ(g.columnwise, c.columnwise) << "numel " << q.size() << " offset " << offset;
      EXPECT_EQ(g.columnwise, expected(shape, q));
    }
  }
}

#else

TEST(ColumnwiseFromRowwiseGpu, SkippedWithoutCudaBuild) {
  GTEST_SKIP() << "fp8kit built without CUDA";
}

#endif  // FP8KIT_WITH_CUDA

}  // namespace
