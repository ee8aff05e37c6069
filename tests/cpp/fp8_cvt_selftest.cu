// fp8kit_test::fp8_cvt_selftest (fp8_cvt_selftest.h): the kernels' FP8
// conversion against fp8_convert.h over all 2^32 float32 bit patterns.
#include "fp8_cvt_selftest.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "fp8_convert.h"
#include "quantize_device.cuh"

namespace fp8kit_test {
namespace {

struct Counters {
  unsigned long long mismatches;
  unsigned int first;
};

template <bool kE4M3>
__global__ void cvt_selftest_kernel(Counters* counters) {
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x * 4;
  for (uint64_t base = (uint64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
       base < (uint64_t(1) << 32); base += stride) {
    float f[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = __uint_as_float(uint32_t(base + i));
    const float one[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    const uint32_t hw = fp8kit::cuda::cvt4<kE4M3>(f[0], f[1], f[2], f[3]);
    const uint32_t q = fp8kit::cuda::quantize4<kE4M3>(f, one, 0);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t sat =
          kE4M3 ? fp8kit::float_to_e4m3_satfinite(f[i]) : fp8kit::float_to_e5m2_satfinite(f[i]);
      const uint32_t cast =
          kE4M3 ? fp8kit::float_to_e4m3_bits(f[i]) : fp8kit::float_to_e5m2_bits(f[i]);
      if (((hw >> (8 * i)) & 0xffu) != sat || ((q >> (8 * i)) & 0xffu) != cast) {
        atomicAdd(&counters->mismatches, 1ull);
        atomicMin(&counters->first, uint32_t(base + i));
      }
    }
  }
}

}  // namespace

CvtSelftestResult fp8_cvt_selftest(bool e4m3) {
  Counters* d = nullptr;
  Counters h{0, 0xffffffffu};
  cudaError_t e = cudaMalloc(&d, sizeof(Counters));
  if (e != cudaSuccess) return CvtSelftestResult{e, 0, 0};
  e = cudaMemcpy(d, &h, sizeof(h), cudaMemcpyHostToDevice);
  if (e == cudaSuccess) {
    if (e4m3) {
      cvt_selftest_kernel<true><<<4096, 256>>>(d);
    } else {
      cvt_selftest_kernel<false><<<4096, 256>>>(d);
    }
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaMemcpy(&h, d, sizeof(h), cudaMemcpyDeviceToHost);
  (void)cudaFree(d);
  return CvtSelftestResult{e, h.mismatches, h.first};
}

}  // namespace fp8kit_test
