// fp8kit_grouped_quantize_delayed_update (fp8kit/grouped.h): on the CPU,
// group by group equal to fp8kit_quantize_delayed_update on that group's
// rows with that group's state, over several steps (fresh and seeded
// groups mixed, empty groups, NaN and inf inputs, recording or not, no
// seeded flags); errors; and on a GPU, CUDA against the CPU bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "fp8kit/fp8kit.h"
#include "quant_test_util.h"

namespace {

using qtest::Buffer;
constexpr int kStride = FP8KIT_GROUP_SCALE_STRIDE;

struct Case {
  int64_t features;
  std::vector<int64_t> sizes;
  fp8kit_dtype dtype = FP8KIT_BFLOAT16;
  int64_t tokens() const { return std::accumulate(sizes.begin(), sizes.end(), int64_t(0)); }
  int64_t groups() const { return int64_t(sizes.size()); }
};

// One state per group, packed (the op's stride layout is made by the runner).
struct State {
  std::vector<float> history;  // [E, len]
  std::vector<float> scale;    // [E]
  std::vector<float> seeded;   // [E], or empty for NULL
};

struct Outcome {
  std::vector<uint8_t> data, columnwise;
  std::vector<float> scale, scale_inv, amax;  // per group
  State state;
};

std::vector<uint32_t> bits(const std::vector<float>& v) {
  std::vector<uint32_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = qtest::float_bits(v[i]);
  return out;
}

// E floats at the op's stride; the floats between them a marker.
std::vector<float> strided(const std::vector<float>& v) {
  std::vector<float> out(v.size() * kStride, -7.0f);
  for (size_t g = 0; g < v.size(); ++g) out[g * kStride] = v[g];
  return out;
}

std::vector<float> unstrided(const std::vector<uint8_t>& bytes, size_t groups) {
  std::vector<float> out(groups);
  for (size_t g = 0; g < groups; ++g) std::memcpy(&out[g], &bytes[g * kStride * 4], 4);
  return out;
}

Outcome run_grouped(fp8kit_device_type dev, const Case& in, const std::vector<uint8_t>& bytes,
                    const State& st, const fp8kit_delayed_scaling_config& c, int record,
                    fp8kit_dtype fp8) {
  const int64_t t = in.tokens(), f = in.features, e = in.groups();
  const int64_t cap = fp8kit_grouped_columnwise_tokens(t, e);
  const size_t scalars = size_t(e) * kStride * 4;
  Buffer x(dev, bytes.size()), data(dev, size_t(t * f)), cw(dev, size_t(f * cap));
  Buffer sizes(dev, size_t(e) * 8), scale(dev, scalars), scale_inv(dev, scalars),
      amax(dev, scalars), history(dev, st.history.size() * 4), state_scale(dev, scalars),
      seeded(dev, scalars);
  x.upload(bytes.data(), bytes.size());
  sizes.upload(in.sizes.data(), size_t(e) * 8);
  history.upload(st.history.data(), st.history.size() * 4);
  state_scale.upload(strided(st.scale).data(), scalars);
  if (!st.seeded.empty()) seeded.upload(strided(st.seeded).data(), scalars);
  const int64_t x_shape[2] = {t, f};
  const int64_t e_shape[1] = {e};
  fp8kit_tensor input = fp8kit_tensor_make(dev, 0, in.dtype, 2, x_shape, x.ptr());
  fp8kit_tensor out = fp8kit_tensor_make(dev, 0, fp8, 2, x_shape, data.ptr());
  out.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  out.columnwise_data = cw.ptr();
  out.scale = scale.fptr();
  out.scale_inv = scale_inv.fptr();
  out.amax = amax.fptr();
  fp8kit_tensor gs = fp8kit_tensor_make(dev, 0, FP8KIT_INT64, 1, e_shape, sizes.ptr());
  const fp8kit_grouped_delayed_state state{history.fptr(), state_scale.fptr(),
                                           st.seeded.empty() ? nullptr : seeded.fptr()};
  EXPECT_EQ(fp8kit_grouped_quantize_delayed_update(&input, &gs, &out, &state, &c, record,
                                                   nullptr),
            FP8KIT_OK)
      << fp8kit_last_error();
  Outcome r;
  r.data = data.download(size_t(t * f));
  r.columnwise = cw.download(size_t(f * cap));
  r.scale = unstrided(scale.download(scalars), size_t(e));
  r.scale_inv = unstrided(scale_inv.download(scalars), size_t(e));
  r.amax = unstrided(amax.download(scalars), size_t(e));
  r.state.history.resize(st.history.size());
  const std::vector<uint8_t> h = history.download(st.history.size() * 4);
  std::memcpy(r.state.history.data(), h.data(), h.size());
  r.state.scale = unstrided(state_scale.download(scalars), size_t(e));
  if (!st.seeded.empty()) r.state.seeded = unstrided(seeded.download(scalars), size_t(e));
  return r;
}

// The reference: fp8kit_quantize_delayed_update on each group's rows with
// that group's state (accumulator and counter 0), laid out as the grouped
// op lays its results out. Its scale and amax are not observable there:
// they are checked against scale_inv and the input (expect_matches).
Outcome reference(const Case& in, const std::vector<uint8_t>& bytes, const State& st,
                  const fp8kit_delayed_scaling_config& c, int record, fp8kit_dtype fp8) {
  const int64_t f = in.features, e = in.groups();
  const int64_t cap = fp8kit_grouped_columnwise_tokens(in.tokens(), e);
  const size_t esize = fp8kit_dtype_size(in.dtype);
  Outcome r;
  r.state = st;
  r.data.assign(size_t(in.tokens() * f), 0);
  r.columnwise.assign(size_t(f * cap), 0);
  r.scale_inv.resize(size_t(e));
  int64_t start = 0, column = 0;
  for (int64_t g = 0; g < e; ++g) {
    const int64_t m = in.sizes[g], padded = (m + 15) / 16 * 16;
    std::vector<uint8_t> rows(bytes.begin() + start * f * esize,
                              bytes.begin() + (start + m) * f * esize);
    rows.resize(rows.size() + 16);  // never an empty vector's NULL data
    std::vector<uint8_t> d(size_t(m * f) + 1), cw(size_t(f * m) + 1);
    fp8kit_tensor x = qtest::make_tensor(FP8KIT_DEVICE_CPU, in.dtype, {m, f}, rows.data());
    fp8kit_tensor o = qtest::make_tensor(FP8KIT_DEVICE_CPU, fp8, {m, f}, d.data());
    o.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
    o.columnwise_data = cw.data();
    o.scale_inv = &r.scale_inv[size_t(g)];
    float accumulator = 0.0f, state_scale_inv = 0.0f;
    unsigned int counter = 0;
    const fp8kit_delayed_quantize_state s{
        r.state.history.data() + g * c.amax_history_len, &accumulator, &r.state.scale[size_t(g)],
        &state_scale_inv, &counter, st.seeded.empty() ? nullptr : &r.state.seeded[size_t(g)]};
    EXPECT_EQ(fp8kit_quantize_delayed_update(&x, &o, &s, nullptr, 1, &c, record, nullptr),
              FP8KIT_OK)
        << fp8kit_last_error();
    std::memcpy(r.data.data() + start * f, d.data(), size_t(m * f));
    for (int64_t col = 0; col < f; ++col) {
      std::memcpy(r.columnwise.data() + f * column + col * padded, cw.data() + col * m,
                  size_t(m));
    }
    start += m;
    column += padded;
  }
  return r;
}

// Group g's max |x| as the op writes it (NaN as the canonical NaN).
std::vector<float> input_amax(const Case& in, const std::vector<uint8_t>& bytes) {
  std::vector<float> out;
  int64_t start = 0;
  for (int64_t m : in.sizes) {
    float a = 0.0f;
    for (int64_t i = start * in.features; i < (start + m) * in.features; ++i) {
      const float v = std::fabs(qtest::input_value(bytes, in.dtype, size_t(i)));
      a = std::isnan(v) || std::isnan(a) ? qtest::bits_float(0x7fc00000u) : std::max(a, v);
    }
    out.push_back(a);
    start += m;
  }
  return out;
}

void expect_matches(const Outcome& got, const Outcome& want, const Case& in,
                    const std::vector<uint8_t>& bytes, const std::string& where) {
  EXPECT_EQ(got.data, want.data) << where;
  EXPECT_EQ(got.columnwise, want.columnwise) << where;
  EXPECT_EQ(bits(got.scale_inv), bits(want.scale_inv)) << where;
  EXPECT_EQ(bits(got.state.history), bits(want.state.history)) << where;
  EXPECT_EQ(bits(got.state.scale), bits(want.state.scale)) << where;
  EXPECT_EQ(got.state.seeded, want.state.seeded) << where;
  EXPECT_EQ(bits(got.amax), bits(input_amax(in, bytes))) << where;
  for (size_t g = 0; g < got.scale.size(); ++g) {
    const float inv = std::isnan(got.scale[g]) ? got.scale[g] : 1.0f / got.scale[g];
    EXPECT_EQ(qtest::float_bits(got.scale_inv[g]), qtest::float_bits(inv))
        << where << ": output scale of group " << g << " is not the one cast with";
  }
}

std::vector<uint8_t> step_input(const Case& in, uint32_t seed, bool specials) {
  const auto x = qtest::random_values(size_t(in.tokens() * in.features), 2.0f + float(seed % 5),
                                      seed, specials, specials);
  return qtest::encode_input(x, in.dtype);
}

// Fresh and seeded groups, empty ones of both kinds, one scale that the
// policy refuses (0: every element of that group the NaN code).
State initial_state(const Case& in, int len, bool flags) {
  State st;
  const int64_t e = in.groups();
  st.history.assign(size_t(e * len), 0.0f);
  for (int64_t g = 0; g < e; ++g) {
    for (int i = 0; i < len; ++i) st.history[size_t(g * len + i)] = float((g + 1) * (i % 3));
  }
  for (int64_t g = 0; g < e; ++g) st.scale.push_back(g == 3 ? 0.0f : 0.5f * float(g + 1));
  if (flags) {
    for (int64_t g = 0; g < e; ++g) st.seeded.push_back(g % 3 == 1 ? 1.0f : 0.0f);
  }
  return st;
}

const Case kCase{32, {5, 0, 37, 16, 1, 0, 20}};
const fp8kit_delayed_scaling_config kConfigs[] = {
    {1, 0, FP8KIT_AMAX_MAX}, {16, 1, FP8KIT_AMAX_MAX}, {5, 0, FP8KIT_AMAX_MOST_RECENT}};

TEST(GroupedDelayed, EachGroupEqualsTheSingleTensorOpOverSteps) {
  for (const auto& c : kConfigs) {
    for (fp8kit_dtype fp8 : {FP8KIT_E4M3, FP8KIT_E5M2}) {
      for (bool flags : {true, false}) {
        State got = initial_state(kCase, c.amax_history_len, flags), want = got;
        // Recorded steps, a step that records nothing, a recorded one again.
        const int records[] = {1, 1, 0, 1};
        for (int step = 0; step < 4; ++step) {
          const auto bytes = step_input(kCase, uint32_t(step + 1), step == 1);
          const std::string where = "len " + std::to_string(c.amax_history_len) + " fp8 " +
                                    std::to_string(fp8) + " flags " + std::to_string(flags) +
                                    " step " + std::to_string(step);
          const Outcome g =
              run_grouped(FP8KIT_DEVICE_CPU, kCase, bytes, got, c, records[step], fp8);
          const Outcome w = reference(kCase, bytes, want, c, records[step], fp8);
          expect_matches(g, w, kCase, bytes, where);
          if (records[step] == 0) {
            EXPECT_EQ(bits(g.state.history), bits(got.history)) << where;
            EXPECT_EQ(bits(g.state.scale), bits(got.scale)) << where;
            EXPECT_EQ(g.state.seeded, got.seeded) << where;
          }
          got = g.state;
          want = w.state;
        }
        if (flags) {
          EXPECT_EQ(got.seeded, std::vector<float>(kCase.sizes.size(), 1.0f));
        }
      }
    }
  }
}

TEST(GroupedDelayed, FreshGroupsSeedFromTheirOwnAmaxEmptyOnesKeepTheirScale) {
  const Case in{16, {4, 0, 8}, FP8KIT_FLOAT32};
  std::vector<float> x(size_t(in.tokens() * 16), 1.0f);
  for (int64_t i = 4 * 16; i < 12 * 16; ++i) x[size_t(i)] = 2.0f;
  const auto bytes = qtest::encode_input(x, in.dtype);
  const fp8kit_delayed_scaling_config c{4, 0, FP8KIT_AMAX_MAX};
  State st{std::vector<float>(12, 0.0f), {3.0f, 5.0f, 7.0f}, {0.0f, 0.0f, 1.0f}};
  const Outcome r = run_grouped(FP8KIT_DEVICE_CPU, in, bytes, st, c, 0, FP8KIT_E4M3);
  EXPECT_EQ(r.scale, (std::vector<float>{448.0f, 5.0f, 7.0f}));
  EXPECT_EQ(r.amax, (std::vector<float>{1.0f, 0.0f, 2.0f}));
  EXPECT_EQ(r.state.seeded, st.seeded) << "a step that records nothing seeds nothing";
  const Outcome rec = run_grouped(FP8KIT_DEVICE_CPU, in, bytes, st, c, 1, FP8KIT_E4M3);
  EXPECT_EQ(rec.state.scale, (std::vector<float>{448.0f, 5.0f, 224.0f}));
  EXPECT_EQ(rec.state.seeded, (std::vector<float>{1.0f, 1.0f, 1.0f}));
  EXPECT_EQ(rec.state.history[4], 0.0f) << "the empty group rolls in amax 0";
}

// A refused scale (0) is cast with as NaN and, when the amax gives no new
// scale (a group of zeros, a history of one), stays in the state as NaN.
TEST(GroupedDelayed, ARefusedScaleThatGetsNoNewOneStaysNan) {
  const Case in{16, {3, 2}, FP8KIT_FLOAT32};
  std::vector<float> x(size_t(in.tokens() * 16), 0.0f);
  for (int64_t i = 3 * 16; i < 5 * 16; ++i) x[size_t(i)] = 0.25f;
  const auto bytes = qtest::encode_input(x, in.dtype);
  const fp8kit_delayed_scaling_config c{1, 0, FP8KIT_AMAX_MAX};
  const State st{{0.0f, 0.0f}, {0.0f, 2.0f}, {1.0f, 1.0f}};
  const Outcome got = run_grouped(FP8KIT_DEVICE_CPU, in, bytes, st, c, 1, FP8KIT_E4M3);
  expect_matches(got, reference(in, bytes, st, c, 1, FP8KIT_E4M3), in, bytes, "zeros");
  EXPECT_TRUE(std::isnan(got.state.scale[0]));
  EXPECT_EQ(got.state.scale[1], 448.0f / 0.25f);
  if (qtest::gpu_available()) {
    const Outcome gpu = run_grouped(FP8KIT_DEVICE_CUDA, in, bytes, st, c, 1, FP8KIT_E4M3);
    EXPECT_EQ(gpu.data, got.data);
    EXPECT_EQ(bits(gpu.state.scale), bits(got.state.scale));
    EXPECT_EQ(bits(gpu.scale_inv), bits(got.scale_inv));
  }
}

TEST(GroupedDelayed, RejectsAMissingOrOverlappingState) {
  const Case in{16, {3, 4}};
  auto bytes = step_input(in, 9, false);
  std::vector<uint8_t> out(7 * 16);
  std::vector<float> scale(8), scale_inv(8), amax(8), history(4), state_scale(8, 1.0f);
  const int64_t x_shape[2] = {7, 16};
  const int64_t e_shape[1] = {2};
  std::vector<int64_t> sizes = in.sizes;
  fp8kit_tensor input = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, in.dtype, 2, x_shape,
                                           bytes.data());
  fp8kit_tensor q = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_E4M3, 2, x_shape, out.data());
  q.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  q.scale = scale.data();
  q.scale_inv = scale_inv.data();
  q.amax = amax.data();
  fp8kit_tensor gs = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_INT64, 1, e_shape,
                                        sizes.data());
  const fp8kit_delayed_scaling_config c{2, 0, FP8KIT_AMAX_MAX};
  const auto expect_error = [&](const fp8kit_grouped_delayed_state* st,
                                const fp8kit_delayed_scaling_config* cfg, const char* what) {
    EXPECT_EQ(fp8kit_grouped_quantize_delayed_update(&input, &gs, &q, st, cfg, 1, nullptr),
              FP8KIT_INVALID_ARGUMENT);
    EXPECT_NE(std::string(fp8kit_last_error()).find(what), std::string::npos)
        << fp8kit_last_error();
  };
  fp8kit_grouped_delayed_state st{history.data(), state_scale.data(), nullptr};
  EXPECT_EQ(fp8kit_grouped_quantize_delayed_update(&input, &gs, &q, &st, &c, 1, nullptr),
            FP8KIT_OK)
      << fp8kit_last_error();
  expect_error(nullptr, &c, "state");
  const fp8kit_delayed_scaling_config zero_len{0, 0, FP8KIT_AMAX_MAX};
  expect_error(&st, &zero_len, "amax_history_len");
  fp8kit_grouped_delayed_state shared{history.data(), scale.data(), nullptr};
  expect_error(&shared, &c, "overlap");
  fp8kit_grouped_delayed_state short_history{history.data(), history.data() + 2, nullptr};
  expect_error(&short_history, &c, "overlap");
  q.amax = nullptr;
  expect_error(&st, &c, "output->amax");
}

// ------------------------------------------------------- CUDA == CPU --

TEST(GroupedDelayedGpu, MatchesTheCpuBitForBit) {
  QTEST_SKIP_WITHOUT_GPU();
  const Case cases[] = {kCase, Case{4096, {1000, 0, 3000, 96, 1}},
                        Case{80, {0, 0, 130, 0}, FP8KIT_FLOAT16},
                        Case{64, {70, 3, 0, 200}, FP8KIT_FLOAT32}};
  const fp8kit_delayed_scaling_config configs[] = {
      {16, 0, FP8KIT_AMAX_MAX}, {300, 3, FP8KIT_AMAX_MAX}, {4, 0, FP8KIT_AMAX_MOST_RECENT}};
  for (const Case& in : cases) {
    for (const auto& c : configs) {
      for (bool flags : {true, false}) {
        State cpu_state = initial_state(in, c.amax_history_len, flags), gpu_state = cpu_state;
        const int records[] = {1, 0, 1, 1};
        for (int step = 0; step < 4; ++step) {
          const auto bytes = step_input(in, uint32_t(11 + step), step == 2);
          const fp8kit_dtype fp8 = step % 2 ? FP8KIT_E5M2 : FP8KIT_E4M3;
          const Outcome cpu =
              run_grouped(FP8KIT_DEVICE_CPU, in, bytes, cpu_state, c, records[step], fp8);
          const Outcome gpu =
              run_grouped(FP8KIT_DEVICE_CUDA, in, bytes, gpu_state, c, records[step], fp8);
          const std::string where = "features " + std::to_string(in.features) + " len " +
                                    std::to_string(c.amax_history_len) + " step " +
                                    std::to_string(step);
          EXPECT_EQ(gpu.data, cpu.data) << where;
          EXPECT_EQ(gpu.columnwise, cpu.columnwise) << where;
          EXPECT_EQ(bits(gpu.scale), bits(cpu.scale)) << where;
          EXPECT_EQ(bits(gpu.scale_inv), bits(cpu.scale_inv)) << where;
          EXPECT_EQ(bits(gpu.amax), bits(cpu.amax)) << where;
          EXPECT_EQ(bits(gpu.state.history), bits(cpu.state.history)) << where;
          EXPECT_EQ(bits(gpu.state.scale), bits(cpu.state.scale)) << where;
          EXPECT_EQ(gpu.state.seeded, cpu.state.seeded) << where;
          cpu_state = cpu.state;
          gpu_state = gpu.state;
        }
      }
    }
  }
}

}  // namespace
