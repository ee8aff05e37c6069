// Device capability queries (fp8kit/device.h).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "fp8kit/fp8kit.h"

namespace {

TEST(Device, CpuDoesNotSupportNonTnFp8Gemm) {
  int supported = -1;
  ASSERT_EQ(fp8kit_supports_non_tn_fp8_gemm(FP8KIT_DEVICE_CPU, 0, &supported), FP8KIT_OK);
  EXPECT_EQ(supported, 0);
}

TEST(Device, NullOutputPointerIsAnError) {
  EXPECT_EQ(fp8kit_supports_non_tn_fp8_gemm(FP8KIT_DEVICE_CPU, 0, nullptr), FP8KIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fp8kit_last_error()).find("supported is NULL"), std::string::npos);
  EXPECT_EQ(fp8kit_cuda_compute_capability(0, nullptr), FP8KIT_INVALID_ARGUMENT);
}

TEST(Device, UnknownDeviceTypeIsAnError) {
  int supported = -1;
  EXPECT_EQ(fp8kit_supports_non_tn_fp8_gemm(static_cast<fp8kit_device_type>(7), 0, &supported),
            FP8KIT_INVALID_ARGUMENT);
}

TEST(Device, CudaOrdinalOutOfRangeIsAnError) {
  int supported = -1, cc = -1;
  const int count = fp8kit_cuda_device_count();
  const fp8kit_status st = fp8kit_supports_non_tn_fp8_gemm(FP8KIT_DEVICE_CUDA, count, &supported);
  const fp8kit_status st_cc = fp8kit_cuda_compute_capability(count, &cc);
  if (fp8kit_built_with_cuda()) {
    EXPECT_EQ(st, FP8KIT_INVALID_ARGUMENT);
    EXPECT_EQ(st_cc, FP8KIT_INVALID_ARGUMENT);
    EXPECT_NE(std::string(fp8kit_last_error()).find("does not exist"), std::string::npos)
        << fp8kit_last_error();
  } else {
    EXPECT_EQ(count, 0);
    EXPECT_EQ(st, FP8KIT_UNSUPPORTED);
    EXPECT_EQ(st_cc, FP8KIT_UNSUPPORTED);
    EXPECT_NE(std::string(fp8kit_last_error()).find("no CUDA support"), std::string::npos)
        << fp8kit_last_error();
  }
  EXPECT_EQ(supported, -1);  // untouched on failure
}

// cuBLASLt's rule as documented in fp8kit/device.h.
bool expected_non_tn(int capability) {
  return (capability >= 100 && capability < 120) || capability >= 130;
}

TEST(DeviceCuda, NonTnAnswerFollowsComputeCapability) {
  const int count = fp8kit_cuda_device_count();
  if (count == 0) GTEST_SKIP() << "no GPU";
  for (int d = 0; d < count; ++d) {
    int cc = 0, supported = -1;
    ASSERT_EQ(fp8kit_cuda_compute_capability(d, &cc), FP8KIT_OK) << fp8kit_last_error();
    ASSERT_EQ(fp8kit_supports_non_tn_fp8_gemm(FP8KIT_DEVICE_CUDA, d, &supported), FP8KIT_OK);
    std::printf("[ info ] CUDA device %d: sm_%d, supports non-TN FP8 GEMM: %d\n", d, cc, supported);
    EXPECT_EQ(supported, expected_non_tn(cc) ? 1 : 0);
    if (cc == 90) {
      EXPECT_EQ(supported, 0) << "Hopper (H100/H200) runs FP8 GEMMs in TN only";
    }
  }
}

TEST(DeviceCuda, ConcurrentQueriesAgree) {
  const int count = fp8kit_cuda_device_count();
  if (count == 0) GTEST_SKIP() << "no GPU";
  std::atomic<int> mismatches{0};
  int first = -1;
  ASSERT_EQ(fp8kit_supports_non_tn_fp8_gemm(FP8KIT_DEVICE_CUDA, count - 1, &first), FP8KIT_OK);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        int s = -1;
        if (fp8kit_supports_non_tn_fp8_gemm(FP8KIT_DEVICE_CUDA, count - 1, &s) != FP8KIT_OK ||
            s != first) {
          ++mismatches;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
