#include "normalization_cpu.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "amax_cpu.h"
#include "dequantize_convert.h"
#include "fused_cast_cpu.h"
#include "norm_math.h"
#include "validate.h"

namespace fp8kit {
namespace {

std::vector<float> load_all(const fp8kit_tensor& t, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = load_high_precision(t.data, t.dtype, i);
  return v;
}

}  // namespace

void norm_forward_cpu(const fp8kit_norm_config& config, const fp8kit_tensor& x,
                      const fp8kit_tensor& gamma, const fp8kit_tensor* beta, fp8kit_tensor* y,
                      fp8kit_tensor* y_fp8, const fp8kit_fused_cast* cast, fp8kit_tensor* mean,
                      fp8kit_tensor& rsigma) {
  const bool layernorm = config.type == FP8KIT_LAYERNORM;
  int64_t rows = 0, hidden = 0;
  flatten_2d(x, &rows, &hidden);
  const float h = float(hidden);
  const std::vector<float> xs = load_all(x, rows * hidden);
  const std::vector<float> g = load_all(gamma, hidden);
  const std::vector<float> b = layernorm ? load_all(*beta, hidden) : std::vector<float>();
  std::vector<float> v(static_cast<size_t>(rows * hidden));
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = &xs[size_t(r * hidden)];
    float mu = 0.0f, var;
    if (layernorm) {
      mu = div_rn(norm_row_sum(hidden, [&](int64_t i) { return row[i]; }), h);
      var = div_rn(norm_row_sum(hidden,
                                [&](int64_t i) {
                                  const float d = sub_rn(row[i], mu);
                                  return mul_rn(d, d);
                                }),
                   h);
      store_rounded(mean->data, FP8KIT_FLOAT32, r, mu);
    } else {
      var = div_rn(norm_row_sum(hidden, [&](int64_t i) { return mul_rn(row[i], row[i]); }), h);
    }
    const float rs = norm_rsigma(var, config.epsilon);
    store_rounded(rsigma.data, FP8KIT_FLOAT32, r, rs);
    for (int64_t c = 0; c < hidden; ++c) {
      const float yv = norm_y(layernorm, norm_xhat(row[c], mu, rs), g[size_t(c)],
                              layernorm ? b[size_t(c)] : 0.0f);
      v[size_t(r * hidden + c)] = yv;
      if (y != nullptr) store_rounded(y->data, y->dtype, r * hidden + c, yv);
    }
  }
  if (y_fp8 != nullptr) fused_cast_cpu(v.data(), rows, hidden, *y_fp8, *cast, nullptr);
}

void norm_backward_cpu(const fp8kit_norm_config& config, const fp8kit_tensor& dy,
                       const fp8kit_tensor& x, const fp8kit_tensor* mean,
                       const fp8kit_tensor& rsigma, const fp8kit_tensor& gamma, fp8kit_tensor& dx,
                       fp8kit_tensor& dgamma, fp8kit_tensor* dbeta) {
  const bool layernorm = config.type == FP8KIT_LAYERNORM;
  int64_t rows = 0, hidden = 0;
  flatten_2d(x, &rows, &hidden);
  const float h = float(hidden);
  const std::vector<float> xs = load_all(x, rows * hidden);
  const std::vector<float> dys = load_all(dy, rows * hidden);
  const std::vector<float> gam = load_all(gamma, hidden);
  const float* mu = layernorm ? static_cast<const float*>(mean->data) : nullptr;
  const float* rs = static_cast<const float*>(rsigma.data);
  const size_t n = static_cast<size_t>(hidden);
  std::vector<float> dgamma_total(n, 0.0f), dbeta_total(n, 0.0f), dgamma_tile(n), dbeta_tile(n);
  std::vector<float> dgamma_group(n), dbeta_group(n);
  std::vector<float> xhat(n), g(n);
  const int64_t group_rows =
      int64_t(FP8KIT_NORM_BACKWARD_TILE_ROWS) * FP8KIT_NORM_BACKWARD_GROUP_TILES;
  for (int64_t r0 = 0; r0 < rows; r0 += FP8KIT_NORM_BACKWARD_TILE_ROWS) {
    if (r0 % group_rows == 0) {
      std::fill(dgamma_group.begin(), dgamma_group.end(), 0.0f);
      std::fill(dbeta_group.begin(), dbeta_group.end(), 0.0f);
    }
    std::fill(dgamma_tile.begin(), dgamma_tile.end(), 0.0f);
    std::fill(dbeta_tile.begin(), dbeta_tile.end(), 0.0f);
    for (int64_t r = r0; r < rows && r < r0 + FP8KIT_NORM_BACKWARD_TILE_ROWS; ++r) {
      const float m = layernorm ? mu[r] : 0.0f;
      for (int64_t c = 0; c < hidden; ++c) {
        const size_t i = size_t(r * hidden + c);
        xhat[size_t(c)] = norm_xhat(xs[i], m, rs[r]);
        g[size_t(c)] = mul_rn(dys[i], gam[size_t(c)]);
        dgamma_tile[size_t(c)] = add_rn(dgamma_tile[size_t(c)], mul_rn(dys[i], xhat[size_t(c)]));
        dbeta_tile[size_t(c)] = add_rn(dbeta_tile[size_t(c)], dys[i]);
      }
      const float c1 = div_rn(
          norm_row_sum(hidden, [&](int64_t c) { return mul_rn(xhat[size_t(c)], g[size_t(c)]); }),
          h);
      const float c2 =
          layernorm ? div_rn(norm_row_sum(hidden, [&](int64_t c) { return g[size_t(c)]; }), h)
                    : 0.0f;
      for (int64_t c = 0; c < hidden; ++c) {
        store_rounded(dx.data, dx.dtype, r * hidden + c,
                      norm_dx(layernorm, g[size_t(c)], xhat[size_t(c)], c1, c2, rs[r]));
      }
    }
    for (int64_t c = 0; c < hidden; ++c) {
      dgamma_group[size_t(c)] = add_rn(dgamma_group[size_t(c)], dgamma_tile[size_t(c)]);
      dbeta_group[size_t(c)] = add_rn(dbeta_group[size_t(c)], dbeta_tile[size_t(c)]);
    }
    const int64_t next = r0 + FP8KIT_NORM_BACKWARD_TILE_ROWS;
    if (next % group_rows == 0 || next >= rows) {
      for (int64_t c = 0; c < hidden; ++c) {
        dgamma_total[size_t(c)] = add_rn(dgamma_total[size_t(c)], dgamma_group[size_t(c)]);
        dbeta_total[size_t(c)] = add_rn(dbeta_total[size_t(c)], dbeta_group[size_t(c)]);
      }
    }
  }
  for (int64_t c = 0; c < hidden; ++c) {
    store_rounded(dgamma.data, dgamma.dtype, c, dgamma_total[size_t(c)]);
    if (dbeta != nullptr) store_rounded(dbeta->data, dbeta->dtype, c, dbeta_total[size_t(c)]);
  }
}

}  // namespace fp8kit
