#include "activation_cpu.h"

#include <cstdint>
#include <vector>

#include "activation_math.h"
#include "amax_cpu.h"
#include "dequantize_convert.h"
#include "fused_cast_cpu.h"
#include "validate.h"

namespace fp8kit {

void activation_forward_cpu(fp8kit_activation act, const fp8kit_tensor& h, fp8kit_tensor* a,
                            fp8kit_tensor* a_fp8, const fp8kit_fused_cast* cast) {
  int64_t rows = 0, h_cols = 0;
  flatten_2d(h, &rows, &h_cols);
  const int64_t f = act == FP8KIT_SWIGLU ? h_cols / 2 : h_cols;
  std::vector<float> v(static_cast<size_t>(rows * f));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < f; ++c) {
      const float x = load_high_precision(h.data, h.dtype, r * h_cols + c);
      const float out =
          act == FP8KIT_SWIGLU
              ? swiglu_f32(x, load_high_precision(h.data, h.dtype, r * h_cols + f + c))
              : gelu_f32(x);
      v[size_t(r * f + c)] = out;
      if (a != nullptr) store_rounded(a->data, a->dtype, r * f + c, out);
    }
  }
  if (a_fp8 != nullptr) fused_cast_cpu(v.data(), rows, f, *a_fp8, *cast, nullptr);
}

void activation_backward_cpu(fp8kit_activation act, const fp8kit_tensor& d_a,
                             const fp8kit_tensor& h, fp8kit_tensor* dh, fp8kit_tensor* dh_fp8,
                             const fp8kit_fused_cast* cast, const fp8kit_column_sums* sums) {
  int64_t rows = 0, h_cols = 0;
  flatten_2d(h, &rows, &h_cols);
  const int64_t f = act == FP8KIT_SWIGLU ? h_cols / 2 : h_cols;
  std::vector<float> v(static_cast<size_t>(rows * h_cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < f; ++c) {
      const float da = load_high_precision(d_a.data, d_a.dtype, r * f + c);
      const float x = load_high_precision(h.data, h.dtype, r * h_cols + c);
      if (act == FP8KIT_SWIGLU) {
        const float up = load_high_precision(h.data, h.dtype, r * h_cols + f + c);
        const SwigluGrad g = swiglu_grad_f32(da, x, up);
        v[size_t(r * h_cols + c)] = g.d_gate;
        v[size_t(r * h_cols + f + c)] = g.d_up;
      } else {
        v[size_t(r * h_cols + c)] = gelu_backward_f32(da, x);
      }
    }
  }
  if (dh != nullptr) {
    for (int64_t i = 0; i < rows * h_cols; ++i) store_rounded(dh->data, dh->dtype, i, v[size_t(i)]);
  }
  if (dh_fp8 != nullptr) fused_cast_cpu(v.data(), rows, h_cols, *dh_fp8, *cast, sums);
}

}  // namespace fp8kit
