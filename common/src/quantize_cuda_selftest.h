// Test hook (not part of the C API): checks on the GPU that the FP8
// conversion the CUDA kernels use (quantize_device.cuh's cvt4, the
// hardware cvt.rn.satfinite instruction) gives the same byte as the
// software conversion of fp8_convert.h for every one of the 2^32 float32
// bit patterns. Only in builds with FP8KIT_WITH_CUDA; used by
// tests/cpp/quantize_test.cc.
#ifndef FP8KIT_SRC_QUANTIZE_CUDA_SELFTEST_H_
#define FP8KIT_SRC_QUANTIZE_CUDA_SELFTEST_H_

#include <cstdint>

namespace fp8kit {
namespace cuda {

struct CvtSelftestResult {
  uint64_t mismatches;      // float32 patterns whose bytes differ
  uint32_t first_mismatch;  // smallest such pattern (0xFFFFFFFF when none)
};

// On the current CUDA device, synchronously. Throws fp8kit::Error on CUDA
// errors.
CvtSelftestResult fp8_cvt_selftest(bool e4m3);

}  // namespace cuda
}  // namespace fp8kit

#endif  // FP8KIT_SRC_QUANTIZE_CUDA_SELFTEST_H_
