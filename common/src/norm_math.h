// The arithmetic of fp8kit/normalization.h written once, host and device
// inline, for the CPU reference and the CUDA kernels: the row-sum order,
// rsigma, the normalized value and the backward dx.
#ifndef FP8KIT_SRC_NORM_MATH_H_
#define FP8KIT_SRC_NORM_MATH_H_

#include <cstdint>

#include "column_sums.h"
#include "compute_scale.h"
#include "float_bits.h"
#include "float_math.h"

namespace fp8kit {

constexpr int kNormLanes = 32;  // lanes of the row-sum order (one warp)
constexpr int kNormChunk = 8;   // consecutive elements per chunk (one 16-byte bf16 vector)

// rsigma = 1 / sqrt(var + epsilon), each step correctly rounded.
FP8KIT_HD float norm_rsigma(float var, float epsilon) {
  return div_rn(1.0f, sqrt_rn(add_rn(var, epsilon)));
}

// xhat = (x - mean) * rsigma; RMSNorm passes mean = 0 (x - 0 is x, bit
// for bit, -0 included).
FP8KIT_HD float norm_xhat(float x, float mean, float rsigma) {
  return mul_rn(sub_rn(x, mean), rsigma);
}

// y = fma(xhat, gamma, beta) (LayerNorm) or xhat * gamma (RMSNorm).
FP8KIT_HD float norm_y(bool layernorm, float xhat, float gamma, float beta) {
  return layernorm ? fma_rn(xhat, gamma, beta) : mul_rn(xhat, gamma);
}

// dx from g = dy * gamma, xhat, c1 = sum(xhat * g) / H, c2 = sum(g) / H.
FP8KIT_HD float norm_dx(bool layernorm, float g, float xhat, float c1, float c2, float rsigma) {
  const float t = layernorm ? fma_rn(xhat, c1, c2) : mul_rn(xhat, c1);
  return mul_rn(sub_rn(g, t), rsigma);
}

// The row sum of fp8kit/normalization.h on the host: element(i) for i in
// [0, hidden), hidden a multiple of kNormChunk.
template <typename Element>
float norm_row_sum(int64_t hidden, Element element) {
  float lane[kNormLanes] = {};
  for (int64_t k = 0; k < hidden / kNormChunk; ++k) {
    float& acc = lane[k % kNormLanes];
    for (int j = 0; j < kNormChunk; ++j) acc = add_rn(acc, element(k * kNormChunk + j));
  }
  for (int o = kNormLanes / 2; o > 0; o /= 2) {
    for (int l = 0; l < o; ++l) lane[l] = add_rn(lane[l], lane[l + o]);
  }
  return lane[0];
}

}  // namespace fp8kit

#endif  // FP8KIT_SRC_NORM_MATH_H_
