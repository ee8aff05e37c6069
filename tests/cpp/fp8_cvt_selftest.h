// The FP8 conversion self-test (CUDA builds only; test code, not part of
// fp8kit_core): checks on the GPU, for every one of the 2^32 float32 bit
// patterns, that the conversion the CUDA kernels use gives the same byte as
// the software conversion of fp8_convert.h: quantize_device.cuh's cvt4 (the
// hardware cvt.rn.satfinite instruction) as float_to_*_satfinite, and
// quantize4 at scale 1 (cvt4 with infinite inputs not saturated) as
// float_to_*_bits. Used by quantize_test.cc.
#ifndef FP8KIT_TESTS_CPP_FP8_CVT_SELFTEST_H_
#define FP8KIT_TESTS_CPP_FP8_CVT_SELFTEST_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace fp8kit_test {

struct CvtSelftestResult {
  cudaError_t error;        // the first CUDA error, or cudaSuccess
  uint64_t mismatches;      // float32 patterns whose bytes differ
  uint32_t first_mismatch;  // smallest such pattern (0xFFFFFFFF when none)
};

// On the current CUDA device, synchronously.
CvtSelftestResult fp8_cvt_selftest(bool e4m3);

}  // namespace fp8kit_test

#endif  // FP8KIT_TESTS_CPP_FP8_CVT_SELFTEST_H_
