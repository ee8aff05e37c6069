// fp8kit_norm_forward / fp8kit_norm_backward on the CPU:
//   - forward bit for bit against the test's own float32 evaluation of the
//     documented order (mean, rsigma, y), and the FP8 output and scaling
//     state against fp8kit_quantize_delayed_update /
//     fp8kit_quantize_current_scaling of that float32 y (both recipes,
//     fresh and seeded slots, recording or not);
//   - forward and backward against float64 math within float32 rounding;
//   - 0 rows, and errors naming the argument.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "fp8kit/fp8kit.h"
#include "fused_cast_util.h"
#include "norm_test_util.h"
#include "quant_test_util.h"

namespace {

using fusedtest::CastSpec;
using normtest::NormInputs;

std::vector<float> decode(const std::vector<uint8_t>& bytes, fp8kit_dtype dtype, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = qtest::input_value(bytes, dtype, i);
  return v;
}

// fp8kit/normalization.h's row sum, written here from its text.
float documented_row_sum(const std::vector<float>& a) {
  float lane[32] = {};
  for (size_t k = 0; k < a.size() / 8; ++k) {
    for (size_t j = 0; j < 8; ++j) lane[k % 32] += a[8 * k + j];
  }
  for (int o = 16; o > 0; o /= 2) {
    for (int l = 0; l < o; ++l) lane[l] += lane[l + o];
  }
  return lane[0];
}

struct Float32Forward {
  std::vector<float> y, mean, rsigma;
};

// The documented forward in float32 (the machine's float ops, no FMA
// contraction on this target; std::fma where the text says fma).
Float32Forward documented_forward(const NormInputs& in) {
  const auto [rows, hidden] = qtest::flat2d(in.shape);
  const bool ln = in.config.type == FP8KIT_LAYERNORM;
  const std::vector<float> x = decode(in.x, in.dtype, size_t(rows * hidden));
  const std::vector<float> g = decode(in.gamma, in.dtype, size_t(hidden));
  const std::vector<float> b = decode(in.beta, in.dtype, size_t(hidden));
  const float h = float(hidden);
  Float32Forward f;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> row(x.begin() + r * hidden, x.begin() + (r + 1) * hidden), sq(row.size());
    float mean = 0.0f;
    if (ln) mean = documented_row_sum(row) / h;
    for (size_t i = 0; i < row.size(); ++i) {
      const float d = row[i] - mean;
      sq[i] = d * d;
    }
    const float rsigma = 1.0f / std::sqrt(documented_row_sum(sq) / h + in.config.epsilon);
    f.mean.push_back(mean);
    f.rsigma.push_back(rsigma);
    for (int64_t c = 0; c < hidden; ++c) {
      const float xhat = (row[size_t(c)] - mean) * rsigma;
      f.y.push_back(ln ? std::fma(xhat, g[size_t(c)], b[size_t(c)]) : xhat * g[size_t(c)]);
    }
  }
  return f;
}

const std::vector<std::vector<int64_t>> kShapes = {{3, 5, 64}, {130, 48}, {17, 1024}, {1, 16}};

TEST(NormForward, CpuFollowsDocumentedOrderAndCastSemantics) {
  uint32_t seed = 1;
  for (fp8kit_norm_type type : {FP8KIT_LAYERNORM, FP8KIT_RMSNORM}) {
    for (fp8kit_dtype dtype : {FP8KIT_FLOAT32, FP8KIT_BFLOAT16, FP8KIT_FLOAT16}) {
      for (const auto& shape : kShapes) {
        for (const CastSpec& spec : fusedtest::cast_specs()) {
          const NormInputs in = normtest::make_inputs(type, dtype, shape, seed++);
          const std::string what = std::string(type == FP8KIT_LAYERNORM ? "LayerNorm " : "RMSNorm ") +
                                   fp8kit_dtype_name(dtype) + " " + fusedtest::spec_name(spec) +
                                   " rows*hidden " + std::to_string(qtest::numel(shape));
          const normtest::ForwardResult got = normtest::run_forward(FP8KIT_DEVICE_CPU, in, spec);
          ASSERT_EQ(got.status, FP8KIT_OK) << what << ": " << got.error;
          const Float32Forward want = documented_forward(in);
          if (type == FP8KIT_LAYERNORM) {
            EXPECT_EQ(got.mean, qtest::encode_input(want.mean, FP8KIT_FLOAT32)) << what << ": mean";
          }
          EXPECT_EQ(got.rsigma, qtest::encode_input(want.rsigma, FP8KIT_FLOAT32)) << what;
          EXPECT_EQ(got.y, fusedtest::rounded_bytes(want.y, dtype)) << what << ": y";
          fusedtest::expect_same_cast(got.cast, fusedtest::reference_cast(spec, shape, want.y),
                                      what);
        }
      }
    }
  }
}

TEST(NormForward, CpuMatchesFloat64) {
  for (fp8kit_norm_type type : {FP8KIT_LAYERNORM, FP8KIT_RMSNORM}) {
    const NormInputs in = normtest::make_inputs(type, FP8KIT_FLOAT32, {37, 4096}, 7);
    const normtest::ForwardResult got = normtest::run_forward(FP8KIT_DEVICE_CPU, in, CastSpec());
    ASSERT_EQ(got.status, FP8KIT_OK) << got.error;
    const std::vector<float> x = decode(in.x, in.dtype, 37 * 4096);
    const std::vector<float> g = decode(in.gamma, in.dtype, 4096);
    const std::vector<float> b = decode(in.beta, in.dtype, 4096);
    const std::vector<float> y = normtest::as_floats(got.y), mean = normtest::as_floats(got.mean),
                             rsigma = normtest::as_floats(got.rsigma);
    for (int r = 0; r < 37; ++r) {
      double m = 0, v = 0;
      for (int c = 0; c < 4096; ++c) m += x[size_t(r * 4096 + c)];
      m = type == FP8KIT_LAYERNORM ? m / 4096 : 0.0;
      for (int c = 0; c < 4096; ++c) v += (x[size_t(r * 4096 + c)] - m) * (x[size_t(r * 4096 + c)] - m);
      const double rs = 1.0 / std::sqrt(v / 4096 + double(in.config.epsilon));
      if (type == FP8KIT_LAYERNORM) {
        EXPECT_NEAR(mean[size_t(r)], m, 1e-5 * (std::fabs(m) + 1)) << r;
      }
      EXPECT_NEAR(rsigma[size_t(r)], rs, 1e-5 * rs) << r;
      for (int c = 0; c < 4096; ++c) {
        const double xh = (x[size_t(r * 4096 + c)] - m) * rs;
        const double want = type == FP8KIT_LAYERNORM ? xh * g[size_t(c)] + b[size_t(c)] : xh * g[size_t(c)];
        ASSERT_NEAR(y[size_t(r * 4096 + c)], want, 2e-5 * (std::fabs(want) + 1)) << r << "," << c;
      }
    }
  }
}

TEST(NormBackward, CpuMatchesFloat64) {
  for (fp8kit_norm_type type : {FP8KIT_LAYERNORM, FP8KIT_RMSNORM}) {
    const int rows = 77, hidden = 512;  // rows over several backward tiles, the last partial
    const NormInputs in = normtest::make_inputs(type, FP8KIT_FLOAT32, {rows, hidden}, 11);
    const normtest::ForwardResult fwd = normtest::run_forward(FP8KIT_DEVICE_CPU, in, CastSpec());
    ASSERT_EQ(fwd.status, FP8KIT_OK) << fwd.error;
    const normtest::BackwardResult got =
        normtest::run_backward(FP8KIT_DEVICE_CPU, in, fwd, FP8KIT_FLOAT32);
    ASSERT_EQ(got.status, FP8KIT_OK) << got.error;
    const bool ln = type == FP8KIT_LAYERNORM;
    const std::vector<float> x = decode(in.x, in.dtype, rows * hidden),
                             dy = decode(in.dy, in.dtype, rows * hidden),
                             g = decode(in.gamma, in.dtype, hidden);
    const std::vector<float> mean = normtest::as_floats(fwd.mean),
                             rs = normtest::as_floats(fwd.rsigma), dx = normtest::as_floats(got.dx),
                             dgamma = normtest::as_floats(got.dgamma),
                             dbeta = normtest::as_floats(got.dbeta);
    std::vector<double> dgamma64(hidden, 0.0), dbeta64(hidden, 0.0), dgamma_abs(hidden, 0.0);
    for (int r = 0; r < rows; ++r) {
      const double m = ln ? mean[size_t(r)] : 0.0, s = rs[size_t(r)];
      double c1 = 0, c2 = 0, gmax = 0;
      for (int c = 0; c < hidden; ++c) {
        const size_t i = size_t(r * hidden + c);
        const double xh = (x[i] - m) * s, gg = double(dy[i]) * g[size_t(c)];
        c1 += xh * gg;
        c2 += gg;
        gmax = std::max(gmax, std::fabs(gg) * (1 + std::fabs(xh)));
        dgamma64[size_t(c)] += dy[i] * xh;
        dgamma_abs[size_t(c)] += std::fabs(dy[i] * xh);
        dbeta64[size_t(c)] += dy[i];
      }
      c1 /= hidden;
      c2 = ln ? c2 / hidden : 0.0;
      for (int c = 0; c < hidden; ++c) {
        const size_t i = size_t(r * hidden + c);
        const double xh = (x[i] - m) * s, gg = double(dy[i]) * g[size_t(c)];
        const double want = (gg - (xh * c1 + c2)) * s;
        ASSERT_NEAR(dx[i], want, 1e-5 * s * gmax) << "dx " << r << "," << c;
      }
    }
    for (int c = 0; c < hidden; ++c) {
      EXPECT_NEAR(dgamma[size_t(c)], dgamma64[size_t(c)], 1e-5 * (dgamma_abs[size_t(c)] + 1)) << c;
      if (ln) {
        EXPECT_NEAR(dbeta[size_t(c)], dbeta64[size_t(c)], 1e-5 * rows) << c;
      }
    }
  }
}

TEST(NormBackward, ParameterGradientsRoundToTheirDtype) {
  const NormInputs in = normtest::make_inputs(FP8KIT_LAYERNORM, FP8KIT_BFLOAT16, {40, 64}, 3);
  const normtest::ForwardResult fwd = normtest::run_forward(FP8KIT_DEVICE_CPU, in, CastSpec());
  const normtest::BackwardResult f32 = normtest::run_backward(FP8KIT_DEVICE_CPU, in, fwd, FP8KIT_FLOAT32);
  ASSERT_EQ(f32.status, FP8KIT_OK) << f32.error;
  for (fp8kit_dtype d : {FP8KIT_BFLOAT16, FP8KIT_FLOAT16}) {
    const normtest::BackwardResult r = normtest::run_backward(FP8KIT_DEVICE_CPU, in, fwd, d);
    ASSERT_EQ(r.status, FP8KIT_OK) << r.error;
    EXPECT_EQ(r.dgamma, qtest::encode_input(normtest::as_floats(f32.dgamma), d));
    EXPECT_EQ(r.dbeta, qtest::encode_input(normtest::as_floats(f32.dbeta), d));
    EXPECT_EQ(r.dx, f32.dx);
  }
}

TEST(Norm, ZeroRows) {
  for (const CastSpec& spec : fusedtest::cast_specs()) {
    const NormInputs in = normtest::make_inputs(FP8KIT_LAYERNORM, FP8KIT_BFLOAT16, {0, 64}, 5);
    const normtest::ForwardResult got = normtest::run_forward(FP8KIT_DEVICE_CPU, in, spec);
    ASSERT_EQ(got.status, FP8KIT_OK) << got.error;
    fusedtest::expect_same_cast(got.cast, fusedtest::reference_cast(spec, in.shape, {}),
                                fusedtest::spec_name(spec));
    const normtest::BackwardResult b = normtest::run_backward(FP8KIT_DEVICE_CPU, in, got, FP8KIT_FLOAT32);
    ASSERT_EQ(b.status, FP8KIT_OK) << b.error;
    EXPECT_EQ(normtest::as_floats(b.dgamma), std::vector<float>(64, 0.0f));
    EXPECT_EQ(normtest::as_floats(b.dbeta), std::vector<float>(64, 0.0f));
  }
}

// Without y_fp8 and cast the forward writes y, mean and rsigma alone, the
// same bits as a forward that casts.
TEST(NormForward, WithoutCastWritesTheSameValues) {
  uint32_t seed = 40;
  for (fp8kit_norm_type type : {FP8KIT_LAYERNORM, FP8KIT_RMSNORM}) {
    for (fp8kit_dtype dtype : {FP8KIT_FLOAT32, FP8KIT_BFLOAT16, FP8KIT_FLOAT16}) {
      for (const std::vector<int64_t>& shape : {std::vector<int64_t>{3, 5, 64},
                                                std::vector<int64_t>{0, 32}}) {
        const NormInputs in = normtest::make_inputs(type, dtype, shape, seed++);
        const normtest::ForwardResult cast =
            normtest::run_forward(FP8KIT_DEVICE_CPU, in, CastSpec());
        const normtest::ForwardResult plain =
            normtest::run_forward(FP8KIT_DEVICE_CPU, in, CastSpec(), 1, /*cast_output=*/false);
        ASSERT_EQ(plain.status, FP8KIT_OK) << plain.error;
        EXPECT_EQ(plain.y, cast.y);
        EXPECT_EQ(plain.mean, cast.mean);
        EXPECT_EQ(plain.rsigma, cast.rsigma);
      }
    }
  }
}

// Each bad argument is refused with a message naming it; nothing is written.
TEST(Norm, ErrorsNameTheArgument) {
  const fp8kit_device_type cpu = FP8KIT_DEVICE_CPU;
  alignas(16) static uint16_t x[4 * 32], g[32], b[32], y[4 * 32], dx[4 * 32];
  alignas(16) static uint8_t q[4 * 32];
  alignas(16) static float mean[4], rs[4], dg[32], db[32], ws[64], scale = 1, scale_inv, amax;
  const int64_t xs[2] = {4, 32}, hs[1] = {32}, rsh[1] = {4};
  fusedtest::CastBuffers cast(cpu, CastSpec(), {4, 32});
  const fp8kit_fused_cast c = cast.cast();
  fp8kit_norm_config cfg{FP8KIT_LAYERNORM, 1e-5f};
  fp8kit_tensor tx = fp8kit_tensor_make(cpu, 0, FP8KIT_BFLOAT16, 2, xs, x);
  fp8kit_tensor tg = fp8kit_tensor_make(cpu, 0, FP8KIT_BFLOAT16, 1, hs, g);
  fp8kit_tensor tb = fp8kit_tensor_make(cpu, 0, FP8KIT_BFLOAT16, 1, hs, b);
  fp8kit_tensor ty = fp8kit_tensor_make(cpu, 0, FP8KIT_BFLOAT16, 2, xs, y);
  fp8kit_tensor tq = cast.out();
  fp8kit_tensor tm = fp8kit_tensor_make(cpu, 0, FP8KIT_FLOAT32, 1, rsh, mean);
  fp8kit_tensor tr = fp8kit_tensor_make(cpu, 0, FP8KIT_FLOAT32, 1, rsh, rs);
  auto fwd = [&](fp8kit_norm_config cf, fp8kit_tensor* x_, fp8kit_tensor* g_, fp8kit_tensor* b_,
                 fp8kit_tensor* y_, fp8kit_tensor* q_, const fp8kit_fused_cast* c_,
                 fp8kit_tensor* m_, fp8kit_tensor* r_) {
    return fp8kit_norm_forward(&cf, x_, g_, b_, y_, q_, c_, m_, r_, nullptr);
  };
  ASSERT_EQ(fwd(cfg, &tx, &tg, &tb, &ty, &tq, &c, &tm, &tr), FP8KIT_OK) << fp8kit_last_error();
  using fusedtest::expect_names;
  expect_names(fwd({FP8KIT_LAYERNORM, -1.0f}, &tx, &tg, &tb, &ty, &tq, &c, &tm, &tr), "epsilon", "eps");
  expect_names(fwd({fp8kit_norm_type(7), 0}, &tx, &tg, &tb, &ty, &tq, &c, &tm, &tr), "type", "type");
  expect_names(fwd(cfg, nullptr, &tg, &tb, &ty, &tq, &c, &tm, &tr), "x", "x NULL");
  fp8kit_tensor bad = tx;
  bad.shape[1] = 24;
  expect_names(fwd(cfg, &bad, &tg, &tb, &ty, &tq, &c, &tm, &tr), "hidden", "hidden 24");
  bad = tx;
  bad.data = reinterpret_cast<uint8_t*>(x) + 2;
  expect_names(fwd(cfg, &bad, &tg, &tb, &ty, &tq, &c, &tm, &tr), "x->data", "misaligned x");
  bad = tg;
  bad.dtype = FP8KIT_FLOAT32;
  expect_names(fwd(cfg, &tx, &bad, &tb, &ty, &tq, &c, &tm, &tr), "gamma", "gamma dtype");
  bad = tg;
  bad.shape[0] = 16;
  expect_names(fwd(cfg, &tx, &bad, &tb, &ty, &tq, &c, &tm, &tr), "gamma", "gamma shape");
  expect_names(fwd(cfg, &tx, &tg, nullptr, &ty, &tq, &c, &tm, &tr), "beta", "beta NULL");
  expect_names(fwd({FP8KIT_RMSNORM, 0}, &tx, &tg, &tb, &ty, &tq, &c, nullptr, &tr), "beta",
               "beta for RMSNorm");
  expect_names(fwd({FP8KIT_RMSNORM, 0}, &tx, &tg, nullptr, &ty, &tq, &c, &tm, &tr), "mean",
               "mean for RMSNorm");
  bad = ty;
  bad.dtype = FP8KIT_FLOAT16;
  expect_names(fwd(cfg, &tx, &tg, &tb, &bad, &tq, &c, &tm, &tr), "y", "y dtype");
  bad = tq;
  bad.dtype = FP8KIT_BFLOAT16;
  expect_names(fwd(cfg, &tx, &tg, &tb, &ty, &bad, &c, &tm, &tr), "y_fp8", "y_fp8 dtype");
  bad = tq;
  bad.scale = &scale;
  expect_names(fwd(cfg, &tx, &tg, &tb, &ty, &bad, &c, &tm, &tr), "y_fp8", "delayed with scale");
  bad = tq;
  bad.data = q + 8;
  expect_names(fwd(cfg, &tx, &tg, &tb, &ty, &bad, &c, &tm, &tr), "y_fp8->data", "misaligned fp8");
  expect_names(fwd(cfg, &tx, &tg, &tb, &ty, &tq, nullptr, &tm, &tr), "cast", "cast NULL");
  ASSERT_EQ(fwd(cfg, &tx, &tg, &tb, &ty, nullptr, nullptr, &tm, &tr), FP8KIT_OK)
      << fp8kit_last_error();
  expect_names(fwd(cfg, &tx, &tg, &tb, &ty, nullptr, &c, &tm, &tr), "cast", "cast without y_fp8");
  expect_names(fwd(cfg, &tx, &tg, &tb, nullptr, nullptr, nullptr, &tm, &tr), "y_fp8",
               "neither y nor y_fp8");
  fp8kit_fused_cast bc = c;
  bc.state.counter = nullptr;
  expect_names(fwd(cfg, &tx, &tg, &tb, &ty, &tq, &bc, &tm, &tr), "cast->state", "no counter");
  bc = c;
  bc.delayed_config.amax_history_len = 0;
  expect_names(fwd(cfg, &tx, &tg, &tb, &ty, &tq, &bc, &tm, &tr), "amax_history_len", "amax_history_len");
  bc = c;
  bc.recipe = FP8KIT_FUSED_CAST_CURRENT;
  expect_names(fwd(cfg, &tx, &tg, &tb, &ty, &tq, &bc, &tm, &tr), "y_fp8", "current without scale");
  bc.current_config.amax_epsilon = NAN;
  expect_names(fwd(cfg, &tx, &tg, &tb, &ty, &tq, &bc, &tm, &tr), "amax_epsilon", "epsilon NaN");
  bc.recipe = fp8kit_fused_cast_recipe(9);
  expect_names(fwd(cfg, &tx, &tg, &tb, &ty, &tq, &bc, &tm, &tr), "recipe", "recipe");
  bad = tr;
  bad.shape[0] = 3;
  expect_names(fwd(cfg, &tx, &tg, &tb, &ty, &tq, &c, &tm, &bad), "rsigma", "rsigma shape");
  bad = tm;
  bad.dtype = FP8KIT_BFLOAT16;
  expect_names(fwd(cfg, &tx, &tg, &tb, &ty, &tq, &c, &bad, &tr), "mean", "mean dtype");

  fp8kit_tensor tdx = fp8kit_tensor_make(cpu, 0, FP8KIT_BFLOAT16, 2, xs, dx);
  fp8kit_tensor tdg = fp8kit_tensor_make(cpu, 0, FP8KIT_FLOAT32, 1, hs, dg);
  fp8kit_tensor tdb = fp8kit_tensor_make(cpu, 0, FP8KIT_FLOAT32, 1, hs, db);
  auto bwd = [&](fp8kit_norm_config cf, fp8kit_tensor* dy_, fp8kit_tensor* dx_,
                 fp8kit_tensor* dg_, fp8kit_tensor* db_, float* w) {
    return fp8kit_norm_backward(&cf, dy_, &tx, cf.type == FP8KIT_LAYERNORM ? &tm : nullptr, &tr,
                                &tg, dx_, dg_, db_, w, nullptr);
  };
  ASSERT_EQ(bwd(cfg, &ty, &tdx, &tdg, &tdb, ws), FP8KIT_OK) << fp8kit_last_error();
  bad = ty;
  bad.shape[0] = 3;
  expect_names(bwd(cfg, &bad, &tdx, &tdg, &tdb, ws), "dy", "dy shape");
  bad = tdx;
  bad.dtype = FP8KIT_FLOAT32;
  expect_names(bwd(cfg, &ty, &bad, &tdg, &tdb, ws), "dx", "dx dtype");
  expect_names(bwd(cfg, &ty, &tdx, nullptr, &tdb, ws), "dgamma", "dgamma NULL");
  bad = tdb;
  bad.dtype = FP8KIT_E4M3;
  expect_names(bwd(cfg, &ty, &tdx, &tdg, &bad, ws), "dbeta", "dbeta dtype");
  expect_names(bwd({FP8KIT_RMSNORM, 0}, &ty, &tdx, &tdg, &tdb, ws), "dbeta", "dbeta for RMSNorm");
  expect_names(bwd(cfg, &ty, &tdx, &tdg, &tdb, nullptr), "workspace", "workspace NULL");
  (void)scale_inv;
  (void)amax;
}

}  // namespace
