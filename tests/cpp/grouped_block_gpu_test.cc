// fp8kit_grouped_quantize_block on CUDA (one launch over every group's
// tiles) == the CPU reference (each group quantized alone) bit for bit:
// the copies, the scale arrays with their padding, the zeroed rows and
// floats after the last group. Skipped without a GPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fp8kit/fp8kit.h"
#include "quant_test_util.h"

namespace {

using qtest::Buffer;

struct Case {
  std::vector<int64_t> sizes;
  int64_t features;
  fp8kit_dtype in;
  int64_t extra_rows;  // the layout's rows after the last group's
};

struct Result {
  std::vector<uint8_t> data, columnwise, scales, columnwise_scales;
};

int64_t padded(int64_t m) {
  return (m + FP8KIT_GEMM_DIM_MULTIPLE - 1) / FP8KIT_GEMM_DIM_MULTIPLE * FP8KIT_GEMM_DIM_MULTIPLE;
}

// The layout's rows: every group's padded rows and c.extra_rows more.
int64_t rows_of(const Case& c) {
  int64_t rows = c.extra_rows;
  for (int64_t m : c.sizes) rows += padded(m);
  return rows;
}

// One grouped quantization on `dev`, the group sizes on `dev` too; `rowwise`
// and `columnwise` pick the copies written.
Result run(fp8kit_device_type dev, const Case& c, const std::vector<uint8_t>& input,
           fp8kit_scaling_mode mode, fp8kit_dtype fp8, bool rowwise, bool columnwise,
           const fp8kit_current_scaling_config& config) {
  const int64_t rows = rows_of(c), e = int64_t(c.sizes.size());
  const size_t elems = size_t(rows * c.features);
  const size_t floats = size_t(fp8kit_grouped_block_scales_floats(rows, e, c.features, mode, 0));
  const size_t cw_floats =
      size_t(fp8kit_grouped_block_scales_floats(rows, e, c.features, mode, 1));
  Buffer in(dev, input.size()), data(dev, elems), cw(dev, elems), sizes(dev, size_t(e) * 8);
  Buffer scales(dev, floats * 4), cw_scales(dev, cw_floats * 4);
  in.upload(input.data(), input.size());
  sizes.upload(c.sizes.data(), size_t(e) * 8);
  const std::vector<int64_t> shape = {rows, c.features}, e_shape = {e};
  fp8kit_tensor it = qtest::make_tensor(dev, c.in, shape, in.ptr());
  fp8kit_tensor ot = qtest::make_tensor(dev, fp8, shape, rowwise ? data.ptr() : nullptr);
  ot.scaling_mode = mode;
  ot.block_scale_inv = rowwise ? scales.fptr() : nullptr;
  ot.columnwise_data = columnwise ? cw.ptr() : nullptr;
  ot.columnwise_block_scale_inv = columnwise ? cw_scales.fptr() : nullptr;
  fp8kit_tensor st = qtest::make_tensor(dev, FP8KIT_INT64, e_shape, sizes.ptr());
  EXPECT_EQ(fp8kit_grouped_quantize_block(&it, &st, &ot, &config, nullptr), FP8KIT_OK)
      << fp8kit_last_error();
  Result r;
  if (rowwise) {
    r.data = data.download(elems);
    r.scales = scales.download(floats * 4);
  }
  if (columnwise) {
    r.columnwise = cw.download(elems);
    r.columnwise_scales = cw_scales.download(cw_floats * 4);
  }
  return r;
}

TEST(GroupedBlockGpu, OneLaunchEqualsEachGroupOnTheCpu) {
  QTEST_SKIP_WITHOUT_GPU();
  // Empty groups first, between and last; groups of one row, of less than
  // a tile, of several tiles with a partial last one; feature counts with
  // a partial last tile (160, 200, 144) or none (256), or rows of no whole
  // 16-byte vectors (100: element loads and byte stores); and 70 groups of
  // mixed sizes.
  std::vector<int64_t> many;
  for (int g = 0; g < 70; ++g) many.push_back((g * 37) % 11 == 0 ? 0 : (g * 53) % 300);
  // Rows after the last group that are no multiple of 8 (5) leave each
  // group's 8-byte columnwise stores as they are.
  const std::vector<Case> cases = {{{0, 130, 0, 5, 256, 1, 0}, 160, FP8KIT_FLOAT32, 32},
                                   {{300, 17}, 256, FP8KIT_BFLOAT16, 5},
                                   {{3, 0, 129}, 200, FP8KIT_FLOAT16, 0},
                                   {many, 144, FP8KIT_BFLOAT16, 16},
                                   {{20, 40}, 100, FP8KIT_FLOAT32, 3}};
  uint32_t seed = 7;
  for (const Case& c : cases) {
    const std::vector<uint8_t> input = qtest::encode_input(
        qtest::random_values(size_t(rows_of(c) * c.features), 3.0f, seed, true), c.in);
    for (fp8kit_scaling_mode mode : {FP8KIT_SCALING_BLOCK_1X128, FP8KIT_SCALING_BLOCK_128X128}) {
      for (fp8kit_dtype fp8 : {FP8KIT_E4M3, FP8KIT_E5M2}) {
        for (int copies = 0; copies < 3; ++copies) {
          const bool rowwise = copies != 1, columnwise = copies != 2;
          const fp8kit_current_scaling_config config{seed % 3 == 0 ? 1e-2f : 0.0f,
                                                     int(seed % 2)};
          ++seed;
          SCOPED_TRACE("groups " + std::to_string(c.sizes.size()) + " features " +
                       std::to_string(c.features) + " mode " + std::to_string(int(mode)) +
                       " fp8 " + std::to_string(int(fp8)) + " copies " + std::to_string(copies));
          const Result cpu =
              run(FP8KIT_DEVICE_CPU, c, input, mode, fp8, rowwise, columnwise, config);
          const Result gpu =
              run(FP8KIT_DEVICE_CUDA, c, input, mode, fp8, rowwise, columnwise, config);
          EXPECT_EQ(gpu.data, cpu.data);
          EXPECT_EQ(gpu.scales, cpu.scales);
          EXPECT_EQ(gpu.columnwise, cpu.columnwise);
          EXPECT_EQ(gpu.columnwise_scales, cpu.columnwise_scales);
        }
      }
    }
  }
}

}  // namespace
