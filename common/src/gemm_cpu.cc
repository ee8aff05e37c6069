#include "gemm_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "amax_cpu.h"
#include "block_scale_layout.h"
#include "float_bits.h"
#include "fp8_convert.h"

namespace fp8kit {
namespace {

// float32 -> bfloat16, round to nearest even; NaN stays a (quiet) NaN.
uint16_t float_to_bf16_bits(float f) {
  const uint32_t x = float_to_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);
  return uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

uint32_t shift_right_rne(uint32_t v, int shift) {
  const uint32_t q = v >> shift;
  const uint32_t rem = v & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

// float32 -> IEEE binary16, round to nearest even; overflow gives inf, as
// the GPU's conversion does.
uint16_t float_to_fp16_bits(float f) {
  const uint32_t x = float_to_bits(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (abs >= 0x38800000u) {  // normal binary16 (>= 2^-14); a mantissa carry bumps the exponent
    return uint16_t(sign | shift_right_rne(abs - ((127u - 15u) << 23), 13));
  }
  // Denormal binary16: an integer count of 2^-24. |x| = sig * 2^(e - 150).
  const uint32_t e = abs >> 23;
  const int shift = 126 - int(e);
  if (e == 0 || shift >= 25) return sign;  // below half of 2^-24
  return uint16_t(sign | shift_right_rne((abs & 0x7fffffu) | 0x800000u, shift));
}

void store_high_precision(void* data, fp8kit_dtype dtype, int64_t i, float v) {
  switch (dtype) {
    case FP8KIT_FLOAT32: static_cast<float*>(data)[i] = v; break;
    case FP8KIT_BFLOAT16: static_cast<uint16_t*>(data)[i] = float_to_bf16_bits(v); break;
    case FP8KIT_FLOAT16: static_cast<uint16_t*>(data)[i] = float_to_fp16_bits(v); break;
    default: break;  // validated before
  }
}

// GELU, tanh approximation (what cuBLASLt's GELU epilogues compute).
double gelu_tanh(double x) {
  const double kSqrt2OverPi = 0.7978845608028654;
  return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)));
}

// The operand decoded to double, as row-major [rows, K] (k_major_out) or
// [K, rows], whichever layout it is stored in; a block-scaled operand
// (always K-major) times its blocks' scale_inv, exact in double (a 4-bit
// significand times a 24-bit one). A per-tensor scale_inv is applied to
// the dot products instead.
std::vector<double> decode(const GemmOperand& op, int64_t rows, int64_t k, bool k_major_out) {
  double lut[256];
  for (int v = 0; v < 256; ++v) lut[v] = fp8_bits_to_float(uint8_t(v), op.dtype);
  const uint8_t* q = static_cast<const uint8_t*>(op.data);
  const bool block = is_block_scaling(op.scaling_mode);
  const BlockScaleLayout blocks = BlockScaleLayout::of(op.scaling_mode, rows, k);
  std::vector<double> out(size_t(rows * k));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const double v = lut[op.k_major ? q[r * k + c] : q[c * rows + r]];
      out[size_t(k_major_out ? r * k + c : c * rows + r)] =
          block ? v * double(op.scale_inv[blocks.index(r, c)]) : v;
    }
  }
  return out;
}

double per_tensor_scale_inv(const GemmOperand& op) {
  return is_block_scaling(op.scaling_mode) ? 1.0 : double(*op.scale_inv);
}

// The dot products of a tile of kRows x kCols outputs: a [m, K] row-major,
// b_t [K, n] (B transposed). Every output's sum runs over K in order, one
// product added at a time, exactly as a plain dot product would; the tile
// only keeps kRows x kCols independent sums in flight, which the compiler
// vectorizes across columns. rows / cols < the tile's size at the edges.
constexpr int kRows = 4, kCols = 4;

void dot_tile(const double* a, const double* b_t, int64_t n, int64_t k, int64_t rows,
              int64_t cols, double (&acc)[kRows][kCols]) {
  for (auto& row : acc) {
    for (double& x : row) x = 0.0;
  }
  if (rows == kRows && cols == kCols) {
    for (int64_t kk = 0; kk < k; ++kk) {
      const double* b = b_t + kk * n;
      for (int r = 0; r < kRows; ++r) {
        const double x = a[r * k + kk];
        for (int c = 0; c < kCols; ++c) acc[r][c] += x * b[c];
      }
    }
    return;
  }
  for (int64_t kk = 0; kk < k; ++kk) {
    const double* b = b_t + kk * n;
    for (int64_t r = 0; r < rows; ++r) {
      const double x = a[r * k + kk];
      for (int64_t c = 0; c < cols; ++c) acc[r][c] += x * b[c];
    }
  }
}

}  // namespace

void gemm_cpu(const GemmProblem& p) {
  const int64_t m = p.m, n = p.n, k = p.k;
  const bool d_fp8 = p.d_dtype == FP8KIT_E4M3 || p.d_dtype == FP8KIT_E5M2;
  float amax = 0.0f;
  if (m > 0 && n > 0) {
    const std::vector<double> a = decode(p.a, m, k, /*k_major_out=*/true);
    const std::vector<double> b_t = decode(p.b, n, k, /*k_major_out=*/false);
    const double scale_ab =
        double(p.alpha) * per_tensor_scale_inv(p.a) * per_tensor_scale_inv(p.b);
    const float d_scale = d_fp8 ? *p.d_scale : 1.0f;
    double acc[kRows][kCols];
    for (int64_t i0 = 0; i0 < m; i0 += kRows) {
      const int64_t rows = std::min<int64_t>(kRows, m - i0);
      for (int64_t j0 = 0; j0 < n; j0 += kCols) {
        const int64_t cols = std::min<int64_t>(kCols, n - j0);
        dot_tile(&a[size_t(i0 * k)], &b_t[size_t(j0)], n, k, rows, cols, acc);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < cols; ++c) {
            const int64_t idx = (i0 + r) * n + j0 + c;
            double x = scale_ab * acc[r][c];
            // beta == 0 never reads D, which may hold garbage (NaN) as with
            // cuBLASLt.
            if (p.beta != 0.0f) {
              x += double(p.beta) * double(load_high_precision(p.d, p.d_dtype, idx));
            }
            if (p.bias != nullptr) x += double(load_high_precision(p.bias, p.bias_dtype, j0 + c));
            if (epilogue_has_gelu(p.epilogue)) {
              if (p.gelu_aux != nullptr) store_high_precision(p.gelu_aux, p.d_dtype, idx, float(x));
              x = gelu_tanh(x);
            }
            const float v = float(x);
            if (d_fp8) {
              // max |D| over the outputs; a NaN anywhere makes it NaN.
              const float mag = std::fabs(v);
              if (std::isnan(mag) || std::isnan(amax)) {
                amax = NAN;
              } else if (mag > amax) {
                amax = mag;
              }
              static_cast<uint8_t*>(p.d)[idx] = quantize_to_fp8(v, d_scale, p.d_dtype);
            } else {
              store_high_precision(p.d, p.d_dtype, idx, v);
            }
          }
        }
      }
    }
  }
  if (d_fp8) {
    if (p.d_amax != nullptr) *p.d_amax = amax;
    if (p.d_scale_inv != nullptr) *p.d_scale_inv = 1.0f / *p.d_scale;
  }
}

}  // namespace fp8kit
