// fp8kit_quantize_current_scaling_many: each tensor's outputs (rowwise and
// columnwise bytes, amax, scale, scale_inv, column sums) bit-identical to
// its own fp8kit_quantize_current_scaling call on the CPU, on the CPU and
// on CUDA, for a mix of cast kinds, dtypes, empty tensors and more tensors
// than one cast launch takes; and its errors.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "fp8kit/fp8kit.h"
#include "fused_run.h"
#include "quant_test_util.h"

namespace {

using qtest::Buffer;
using qtest::QuantResult;
using qtest::QuantSpec;

struct Tensor {
  QuantSpec spec;
  std::vector<uint8_t> input;
};

// fused_run.h's mix of cast kinds (12 tensors, 7 of them sharing one cast
// kernel), as current scaling with column sums on every third tensor that
// can have them, and a NaN in one.
std::vector<Tensor> mixed_tensors(uint32_t seed, fp8kit_current_scaling_config config) {
  std::vector<Tensor> v;
  int i = 0;
  for (const fused::Member& m : fused::mixed_members(1, seed)) {
    Tensor t{m.spec, m.input};
    t.spec.current = true;
    t.spec.config = config;
    const auto [rows, cols] = qtest::flat2d(t.spec.shape);
    t.spec.with_sums = t.spec.columnwise && rows > 1 && cols > 1 && i % 3 == 0;
    t.spec.sums_dtype = i % 2 == 0 ? FP8KIT_FLOAT32 : FP8KIT_BFLOAT16;
    v.push_back(t);
    ++i;
  }
  std::vector<float> x = qtest::random_values(64 * 130, 2.0f, seed + 99, false);
  x[1000] = NAN;
  v.push_back(Tensor{v[1].spec, {}});
  v.back().spec.shape = {64, 130};
  v.back().spec.with_sums = false;
  v.back().input = qtest::encode_input(x, v.back().spec.in_dtype);
  return v;
}

// One tensor's buffers on `dev`, as qtest::run_quantize lays them out.
struct Buffers {
  Buffers(fp8kit_device_type dev, const Tensor& t)
      : n(size_t(qtest::numel(t.spec.shape))),
        rows(qtest::flat2d(t.spec.shape).first),
        cols(qtest::flat2d(t.spec.shape).second),
        tiles_c(size_t((cols + 127) / 128)),
        in(dev, t.input.size()),
        out(dev, n),
        columnwise(dev, n),
        amax(dev, 4),
        scale(dev, 4),
        scale_inv(dev, 4),
        sums(dev, size_t(cols) * fp8kit_dtype_size(t.spec.sums_dtype)),
        counters(dev, tiles_c * 4),
        partials(dev, size_t(fp8kit_column_sums_workspace(rows, cols)) * 4) {
    in.upload(t.input.data(), t.input.size());
    for (Buffer* b : {&amax, &scale, &scale_inv}) b->set_float(-7.0f);
    counters.upload(std::vector<uint8_t>(tiles_c * 4, 0).data(), tiles_c * 4);
  }
  size_t n;
  int64_t rows, cols;
  size_t tiles_c;
  Buffer in, out, columnwise, amax, scale, scale_inv, sums, counters, partials;
};

// All of `tensors` in one fp8kit_quantize_current_scaling_many call on `dev`.
std::vector<QuantResult> run_many(fp8kit_device_type dev, const std::vector<Tensor>& tensors,
                                  fp8kit_current_scaling_config config,
                                  fp8kit_status* status) {
  std::vector<std::unique_ptr<Buffers>> bufs;
  std::vector<fp8kit_tensor> ins, outs;
  std::vector<fp8kit_column_sums> sums;
  for (const Tensor& t : tensors) {
    bufs.push_back(std::make_unique<Buffers>(dev, t));
    Buffers& b = *bufs.back();
    ins.push_back(qtest::make_tensor(dev, t.spec.in_dtype, t.spec.shape, b.in.ptr()));
    fp8kit_tensor o =
        qtest::make_tensor(dev, t.spec.fp8, t.spec.shape, t.spec.rowwise ? b.out.ptr() : nullptr);
    o.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
    o.columnwise_data = t.spec.columnwise ? b.columnwise.ptr() : nullptr;
    o.scale = b.scale.fptr();
    o.scale_inv = b.scale_inv.fptr();
    o.amax = b.amax.fptr();
    outs.push_back(o);
    sums.push_back(t.spec.with_sums
                       ? fp8kit_column_sums{b.sums.ptr(), t.spec.sums_dtype, b.partials.fptr(),
                                            static_cast<unsigned int*>(b.counters.ptr())}
                       : fp8kit_column_sums{nullptr, FP8KIT_FLOAT32, nullptr, nullptr});
  }
  *status = fp8kit_quantize_current_scaling_many(ins.data(), outs.data(), sums.data(),
                                                 int(tensors.size()), &config, nullptr);
  std::vector<QuantResult> results;
  if (*status != FP8KIT_OK) return results;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const QuantSpec& s = tensors[i].spec;
    Buffers& b = *bufs[i];
    QuantResult r;
    r.status = FP8KIT_OK;
    if (s.rowwise) r.data = b.out.download(b.n);
    if (s.columnwise) r.columnwise = b.columnwise.download(b.n);
    if (s.with_sums) {
      r.sums = b.sums.download(size_t(b.cols) * fp8kit_dtype_size(s.sums_dtype));
      r.sums_counters = b.counters.download(b.tiles_c * 4);
    }
    r.amax = b.amax.get_float();
    r.scale = b.scale.get_float();
    r.scale_inv = b.scale_inv.get_float();
    results.push_back(r);
  }
  return results;
}

void expect_each_as_alone(fp8kit_device_type dev, uint32_t seed,
                          fp8kit_current_scaling_config config) {
  const std::vector<Tensor> tensors = mixed_tensors(seed, config);
  fp8kit_status status;
  const std::vector<QuantResult> many = run_many(dev, tensors, config, &status);
  ASSERT_EQ(status, FP8KIT_OK) << fp8kit_last_error();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const QuantResult alone = qtest::run_quantize(FP8KIT_DEVICE_CPU, tensors[i].spec,
                                                  tensors[i].input);
    ASSERT_EQ(alone.status, FP8KIT_OK) << alone.error;
    qtest::expect_same_result(alone, many[i], "tensor " + std::to_string(i));
  }
  EXPECT_TRUE(std::isnan(many.back().amax));  // the NaN tensor: scale 1
  EXPECT_EQ(many.back().scale, 1.0f);
}

TEST(CurrentScalingMany, EachTensorAsItsOwnCall) {
  expect_each_as_alone(FP8KIT_DEVICE_CPU, 700, {0.0f, 0});
  expect_each_as_alone(FP8KIT_DEVICE_CPU, 710, {1e-3f, 1});
}

TEST(CurrentScalingMany, Errors) {
  const fp8kit_current_scaling_config config{0.0f, 0};
  std::vector<Tensor> two(2);
  for (Tensor& t : two) {
    t.spec.shape = {4, 8};
    t.spec.current = true;
    t.input = qtest::encode_input(std::vector<float>(32, 1.0f), t.spec.in_dtype);
  }
  Buffers bufs[2] = {{FP8KIT_DEVICE_CPU, two[0]}, {FP8KIT_DEVICE_CPU, two[1]}};
  fp8kit_tensor ins[2], outs[2];
  for (int i = 0; i < 2; ++i) {
    ins[i] = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_BFLOAT16, {4, 8}, bufs[i].in.ptr());
    outs[i] = qtest::make_tensor(FP8KIT_DEVICE_CPU, FP8KIT_E4M3, {4, 8}, bufs[i].out.ptr());
    outs[i].scaling_mode = FP8KIT_SCALING_PER_TENSOR;
    outs[i].scale = bufs[i].scale.fptr();
    outs[i].scale_inv = bufs[i].scale_inv.fptr();
    outs[i].amax = bufs[i].amax.fptr();
  }
  auto expect = [&](int count, const fp8kit_current_scaling_config* c, const char* fragment) {
    EXPECT_EQ(fp8kit_quantize_current_scaling_many(ins, outs, nullptr, count, c, nullptr),
              FP8KIT_INVALID_ARGUMENT) << fragment;
    const std::string msg = fp8kit_last_error();
    EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
    EXPECT_NE(msg.find("quantize_current_scaling_many"), std::string::npos) << msg;
  };
  ASSERT_EQ(fp8kit_quantize_current_scaling_many(ins, outs, nullptr, 2, &config, nullptr),
            FP8KIT_OK) << fp8kit_last_error();
  EXPECT_EQ(fp8kit_quantize_current_scaling_many(nullptr, nullptr, nullptr, 0, &config, nullptr),
            FP8KIT_OK) << fp8kit_last_error();
  expect(65, &config, "count is 65");
  expect(-1, &config, "count is -1");
  expect(2, nullptr, "config is NULL");
  outs[1].amax = outs[0].amax;
  expect(2, &config, "outputs[0] and outputs[1] share");
  outs[1].amax = bufs[1].amax.fptr();
  outs[1].scale_inv = outs[0].scale;
  expect(2, &config, "outputs[0] and outputs[1] share");
  outs[1].scale_inv = bufs[1].scale_inv.fptr();
  outs[1].scale = nullptr;
  expect(2, &config, "(tensor 1)");
}

#ifdef FP8KIT_WITH_CUDA

TEST(CudaCurrentScalingMany, EachTensorAsItsOwnCpuCall) {
  QTEST_SKIP_WITHOUT_GPU();
  expect_each_as_alone(FP8KIT_DEVICE_CUDA, 720, {0.0f, 0});
  expect_each_as_alone(FP8KIT_DEVICE_CUDA, 730, {1e-3f, 1});
}

#else

TEST(CudaCurrentScalingMany, SkippedWithoutCudaBuild) {
  GTEST_SKIP() << "fp8kit built without CUDA";
}

#endif  // FP8KIT_WITH_CUDA

}  // namespace
