// Helpers of the quantization tests (amax, quantize, dequantize, current
// and delayed scaling): an independent reference for FP8 rounding, input
// generators, and one runner that calls the C API on the CPU or on a GPU
// (copying through cudaMalloc'd buffers) so CPU and CUDA results can be
// compared byte for byte.
//
// Independence: the reference decodes the 256 FP8 codes with ldexp and
// picks the nearest code by binary search over those values in double
// precision, breaking exact ties towards the even code. It shares no code
// with common/src/fp8_convert.h.
#ifndef FP8KIT_TESTS_CPP_QUANT_TEST_UTIL_H_
#define FP8KIT_TESTS_CPP_QUANT_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "fp8kit/fp8kit.h"
#include "reference_decode.h"

#ifdef FP8KIT_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace qtest {

// ------------------------------------------------------------ decoding --

using testref::decode_fp8;
using testref::decode_fp16;

inline float bits_float(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
inline uint32_t float_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
inline float decode_bf16(uint16_t h) { return bits_float(uint32_t(h) << 16); }

// ------------------------------------------------ reference rounding --

// The non-negative finite values of a format with their codes, ascending.
struct ValueTable {
  std::vector<double> values;
  std::vector<uint16_t> codes;
};

// Nearest entry to a >= 0 (a below the table's last value), ties to the
// even code.
inline uint16_t nearest_code(const ValueTable& t, double a) {
  const size_t hi = size_t(std::upper_bound(t.values.begin(), t.values.end(), a) - t.values.begin());
  const size_t lo = hi - 1;  // values[0] == 0 <= a
  if (t.values[lo] == a || hi == t.values.size()) return t.codes[lo];
  const double dl = a - t.values[lo], dh = t.values[hi] - a;
  if (dl < dh) return t.codes[lo];
  if (dh < dl) return t.codes[hi];
  return (t.codes[lo] & 1) == 0 ? t.codes[lo] : t.codes[hi];
}

inline ValueTable build_fp8_table(fp8kit_dtype dtype) {
  std::vector<std::pair<double, uint16_t>> v;
  for (int c = 0; c < 128; ++c) {
    const double x = decode_fp8(uint8_t(c), dtype);
    if (std::isfinite(x)) v.push_back({x, uint16_t(c)});
  }
  std::sort(v.begin(), v.end());
  ValueTable t;
  for (const auto& p : v) {
    t.values.push_back(p.first);
    t.codes.push_back(p.second);
  }
  return t;
}

inline const ValueTable& fp8_table(fp8kit_dtype dtype) {
  static const ValueTable e4m3 = build_fp8_table(FP8KIT_E4M3);
  static const ValueTable e5m2 = build_fp8_table(FP8KIT_E5M2);
  return dtype == FP8KIT_E4M3 ? e4m3 : e5m2;
}

inline double fp8_max_value(fp8kit_dtype dtype) { return dtype == FP8KIT_E4M3 ? 448.0 : 57344.0; }

// The FP8 code of a float32 value y under fp8kit's rules: NaN -> 0x7F;
// +-inf -> 0x7F in E4M3 (NaN: it has no inf), +-inf (0x7C / 0xFC) in E5M2;
// finite |y| >= max -> +-max, else nearest with ties to even; the sign is
// kept (also for results that round to zero).
inline uint8_t ref_encode(float y, fp8kit_dtype dtype) {
  if (std::isnan(y)) return 0x7f;
  const uint8_t sign = std::signbit(y) ? 0x80 : 0x00;
  if (std::isinf(y)) return dtype == FP8KIT_E4M3 ? 0x7f : uint8_t(sign | 0x7c);
  const double a = std::fabs(double(y));
  const ValueTable& t = fp8_table(dtype);
  if (a >= t.values.back()) return uint8_t(sign | t.codes.back());
  return uint8_t(sign | nearest_code(t, a));
}

// x * scale rounded once to float32 (the product of two floats is exact in
// double).
inline float ref_scaled(float x, float scale) { return float(double(x) * double(scale)); }

// The code of input element x at `scale`: that of x * scale, except that a
// finite x whose product overflows float32 saturates (only an infinite x
// gives a non-finite code).
inline uint8_t ref_quantize(float x, float scale, fp8kit_dtype dtype) {
  const float y = ref_scaled(x, scale);
  if (std::isfinite(x) && std::isinf(y)) return ref_encode(std::copysign(FLT_MAX, y), dtype);
  return ref_encode(y, dtype);
}

// float32 -> bfloat16 / float16 by nearest search (ties to even, overflow to
// inf past the midpoint to the next power of two); NaN is not handled here.
inline uint16_t ref_to_bf16(float x) {
  const uint32_t b = float_bits(x);
  const uint16_t sign = uint16_t((b >> 16) & 0x8000u);
  const double a = std::fabs(double(x));
  const uint16_t lo = uint16_t((b & 0x7fffffffu) >> 16);  // truncated magnitude
  const double vlo = std::fabs(double(decode_bf16(lo)));
  if (vlo == a) return uint16_t(sign | lo);
  const uint16_t hi = uint16_t(lo + 1);
  const double vhi = hi == 0x7f80 ? std::ldexp(1.0, 128) : std::fabs(double(decode_bf16(hi)));
  const double dl = a - vlo, dh = vhi - a;
  const uint16_t pick = dl < dh ? lo : dh < dl ? hi : ((lo & 1) == 0 ? lo : hi);
  return uint16_t(sign | pick);
}

inline uint16_t ref_to_fp16(float x) {
  static const ValueTable t = [] {
    ValueTable v;
    for (int c = 0; c < 0x7c00; ++c) {
      v.values.push_back(decode_fp16(uint16_t(c)));
      v.codes.push_back(uint16_t(c));
    }
    v.values.push_back(65536.0);  // the rounding boundary of inf
    v.codes.push_back(0x7c00);
    return v;
  }();
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(double(x));
  if (a >= 65536.0) return uint16_t(sign | 0x7c00);
  return uint16_t(sign | nearest_code(t, a));
}

// ---------------------------------------------------------- inputs --

// Host bytes of a float32 / bfloat16 / float16 tensor built from floats
// (bf16/fp16 by the reference rounding above).
inline std::vector<uint8_t> encode_input(const std::vector<float>& x, fp8kit_dtype dtype) {
  std::vector<uint8_t> out(x.size() * fp8kit_dtype_size(dtype));
  for (size_t i = 0; i < x.size(); ++i) {
    if (dtype == FP8KIT_FLOAT32) {
      std::memcpy(&out[4 * i], &x[i], 4);
    } else {
      uint16_t h = std::isnan(x[i]) ? (dtype == FP8KIT_BFLOAT16 ? 0x7fc0 : 0x7e00)
                   : dtype == FP8KIT_BFLOAT16 ? ref_to_bf16(x[i])
                                              : ref_to_fp16(x[i]);
      std::memcpy(&out[2 * i], &h, 2);
    }
  }
  return out;
}

// Element i of an input byte buffer as float (independent decoding).
inline float input_value(const std::vector<uint8_t>& bytes, fp8kit_dtype dtype, size_t i) {
  if (dtype == FP8KIT_FLOAT32) {
    float f;
    std::memcpy(&f, &bytes[4 * i], 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, &bytes[2 * i], 2);
  return dtype == FP8KIT_BFLOAT16 ? decode_bf16(h) : float(decode_fp16(h));
}

// n values: normal(0, sigma) with a few exact specials mixed in when
// `specials` (NaN excluded unless `nan`).
inline std::vector<float> random_values(size_t n, float sigma, uint32_t seed, bool specials,
                                        bool nan = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> x(n);
  for (auto& v : x) v = normal(rng);
  if (specials) {
    const float sp[] = {0.0f, -0.0f, INFINITY, -INFINITY, 448.0f, -57344.0f, 1e-40f, -1e-42f,
                        std::numeric_limits<float>::max(), 464.0f, 0.0009765625f};
    for (size_t k = 0; k < sizeof(sp) / sizeof(sp[0]) && n > 0; ++k) x[(k * 7919u) % n] = sp[k];
  }
  if (nan && n > 0) x[(n * 2) / 3] = NAN;
  return x;
}

// ------------------------------------------------------- tensors --

inline fp8kit_tensor make_tensor(fp8kit_device_type dev, fp8kit_dtype dtype,
                                 const std::vector<int64_t>& shape, void* data) {
  return fp8kit_tensor_make(dev, 0, dtype, int(shape.size()), shape.data(), data);
}

inline int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// [rows, cols] flattening of the columnwise layout.
inline std::pair<int64_t, int64_t> flat2d(const std::vector<int64_t>& shape) {
  if (shape.empty()) return {1, 1};
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  return {rows, shape.back()};
}

inline bool gpu_available() { return fp8kit_cuda_device_count() > 0; }

#define QTEST_SKIP_WITHOUT_GPU() \
  if (!::qtest::gpu_available()) GTEST_SKIP() << "no CUDA device visible"

// A buffer on the CPU or on the GPU, `offset` bytes into its allocation (to
// test misaligned pointers). Copies in and out as host bytes.
class Buffer {
 public:
  Buffer(fp8kit_device_type dev, size_t bytes, size_t offset = 0)
      : dev_(dev), bytes_(bytes), offset_(offset) {
    const size_t total = bytes + offset + 16;
    if (dev == FP8KIT_DEVICE_CPU) {
      host_.assign(total + 256, 0xCD);
      // 256-byte aligned base, then the offset.
      const uintptr_t p = reinterpret_cast<uintptr_t>(host_.data());
      base_ = host_.data() + ((256 - p % 256) % 256);
    } else {
#ifdef FP8KIT_WITH_CUDA
      EXPECT_EQ(cudaMalloc(&base_dev_, total), cudaSuccess);
      EXPECT_EQ(cudaMemset(base_dev_, 0xCD, total), cudaSuccess);
      base_ = static_cast<uint8_t*>(base_dev_);
#endif
    }
  }
  ~Buffer() {
#ifdef FP8KIT_WITH_CUDA
    if (base_dev_) cudaFree(base_dev_);
#endif
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* ptr() { return base_ + offset_; }
  float* fptr() { return reinterpret_cast<float*>(ptr()); }

  void upload(const void* src, size_t n) {
    if (n == 0) return;
    if (dev_ == FP8KIT_DEVICE_CPU) {
      std::memcpy(ptr(), src, n);
    } else {
#ifdef FP8KIT_WITH_CUDA
      EXPECT_EQ(cudaMemcpy(ptr(), src, n, cudaMemcpyHostToDevice), cudaSuccess);
#endif
    }
  }
  std::vector<uint8_t> download(size_t n) {
    std::vector<uint8_t> out(n);
    if (n == 0) return out;
    if (dev_ == FP8KIT_DEVICE_CPU) {
      std::memcpy(out.data(), ptr(), n);
    } else {
#ifdef FP8KIT_WITH_CUDA
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(out.data(), ptr(), n, cudaMemcpyDeviceToHost), cudaSuccess);
#endif
    }
    return out;
  }
  float get_float() {
    const std::vector<uint8_t> b = download(4);
    float f;
    std::memcpy(&f, b.data(), 4);
    return f;
  }
  void set_float(float f) { upload(&f, 4); }

 private:
  fp8kit_device_type dev_;
  size_t bytes_, offset_;
  std::vector<uint8_t> host_;
  uint8_t* base_ = nullptr;
  void* base_dev_ = nullptr;
};

// ------------------------------------------------- one quantize run --

struct QuantSpec {
  fp8kit_dtype in_dtype = FP8KIT_BFLOAT16;
  std::vector<int64_t> shape;
  fp8kit_dtype fp8 = FP8KIT_E4M3;
  bool rowwise = true;
  bool columnwise = true;
  bool with_amax = true;
  bool current = false;        // current scaling (else delayed with `scale`)
  float scale = 1.0f;          // delayed scaling
  fp8kit_current_scaling_config config{0.0f, 0};
  bool with_sums = false;      // current scaling: column sums too
  fp8kit_dtype sums_dtype = FP8KIT_FLOAT32;
  size_t in_offset = 0;        // bytes; a multiple of the element size
  size_t out_offset = 0;       // bytes, for data and columnwise_data
};

struct QuantResult {
  fp8kit_status status = FP8KIT_INTERNAL;
  std::string error;
  std::vector<uint8_t> data, columnwise;
  std::vector<uint8_t> sums, sums_counters;  // with_sums only
  float amax = -1.0f, scale = -1.0f, scale_inv = -1.0f;
};

inline QuantResult run_quantize(fp8kit_device_type dev, const QuantSpec& s,
                                const std::vector<uint8_t>& input) {
  const size_t n = size_t(numel(s.shape));
  Buffer in(dev, input.size(), s.in_offset), out(dev, n, s.out_offset),
      columnwise(dev, n, s.out_offset);
  Buffer amax(dev, 4), scale(dev, 4), scale_inv(dev, 4);
  in.upload(input.data(), input.size());
  scale.set_float(s.current ? -7.0f : s.scale);
  scale_inv.set_float(-7.0f);
  amax.set_float(-7.0f);
  fp8kit_tensor ti = make_tensor(dev, s.in_dtype, s.shape, in.ptr());
  fp8kit_tensor to = make_tensor(dev, s.fp8, s.shape, s.rowwise ? out.ptr() : nullptr);
  to.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  to.columnwise_data = s.columnwise ? columnwise.ptr() : nullptr;
  to.scale = scale.fptr();
  to.scale_inv = scale_inv.fptr();
  to.amax = s.with_amax ? amax.fptr() : nullptr;
  const auto [rows, cols] = flat2d(s.shape);
  const size_t sums_bytes = size_t(cols) * fp8kit_dtype_size(s.sums_dtype);
  const size_t tiles_c = size_t((cols + 127) / 128);
  Buffer sums(dev, sums_bytes), counters(dev, tiles_c * 4),
      partials(dev, size_t(fp8kit_column_sums_workspace(rows, cols)) * 4);
  counters.upload(std::vector<uint8_t>(tiles_c * 4, 0).data(), tiles_c * 4);
  const fp8kit_column_sums cs{sums.ptr(), s.sums_dtype, partials.fptr(),
                              static_cast<unsigned int*>(counters.ptr())};
  QuantResult r;
  r.status = s.current ? fp8kit_quantize_current_scaling(&ti, &to, &s.config,
                                                         s.with_sums ? &cs : nullptr, nullptr)
                       : fp8kit_quantize(&ti, &to, nullptr);
  r.error = fp8kit_last_error();
  if (r.status != FP8KIT_OK) return r;
  if (s.with_sums) {
    r.sums = sums.download(sums_bytes);
    r.sums_counters = counters.download(tiles_c * 4);
  }
  if (s.rowwise) r.data = out.download(n);
  if (s.columnwise) r.columnwise = columnwise.download(n);
  r.amax = amax.get_float();
  r.scale = scale.get_float();
  r.scale_inv = scale_inv.get_float();
  return r;
}

// Same float, or both NaN.
inline bool same_float(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || float_bits(a) == float_bits(b);
}

// Checks that `r` is the reference quantization of `input` with `scale`:
// every rowwise byte, every columnwise byte (at the transposed position).
inline void expect_matches_reference(const QuantSpec& s, const std::vector<uint8_t>& input,
                                     const QuantResult& r, float scale) {
  const auto [rows, cols] = flat2d(s.shape);
  int bad = 0;
  for (int64_t i = 0; i < rows && bad < 5; ++i) {
    for (int64_t j = 0; j < cols && bad < 5; ++j) {
      const float x = input_value(input, s.in_dtype, size_t(i * cols + j));
      const uint8_t want = ref_quantize(x, scale, s.fp8);
      if (s.rowwise && r.data[size_t(i * cols + j)] != want) {
        ADD_FAILURE() << "rowwise [" << i << "," << j << "] x=" << x << " scale=" << scale
                      << ": got 0x" << std::hex << int(r.data[size_t(i * cols + j)])
                      << " want 0x" << int(want) << std::dec;
        ++bad;
      }
      if (s.columnwise && r.columnwise[size_t(j * rows + i)] != want) {
        ADD_FAILURE() << "columnwise [" << j << "," << i << "] x=" << x << " scale=" << scale
                      << ": got 0x" << std::hex << int(r.columnwise[size_t(j * rows + i)])
                      << " want 0x" << int(want) << std::dec;
        ++bad;
      }
    }
  }
}

// max |x| in double over an input (NaN if any NaN; 0 if empty).
inline float ref_amax(const std::vector<uint8_t>& input, fp8kit_dtype dtype, size_t n) {
  double m = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double a = std::fabs(double(input_value(input, dtype, i)));
    if (std::isnan(a)) return NAN;
    m = std::max(m, a);
  }
  return float(m);
}

// fp8kit_column_sums of a [rows, cols] input in its documented order
// (fp8kit/column_sums.h), as `out` bytes: float32 adds of 8-row groups,
// 16-group tiles and the tiles, each from 0.0f; rows past the end add 0;
// then the reference rounding (NaN: the canonical quiet NaN).
inline std::vector<uint8_t> ref_column_sums(const std::vector<uint8_t>& input,
                                            fp8kit_dtype in_dtype, int64_t rows, int64_t cols,
                                            fp8kit_dtype out) {
  const int64_t tiles = (rows + 127) / 128;
  std::vector<uint8_t> bytes(size_t(cols) * fp8kit_dtype_size(out));
  for (int64_t c = 0; c < cols; ++c) {
    float total = 0.0f;
    for (int64_t t = 0; t < tiles; ++t) {
      float tile = 0.0f;
      for (int g = 0; g < 16; ++g) {
        float group = 0.0f;
        for (int k = 0; k < 8; ++k) {
          const int64_t r = t * 128 + g * 8 + k;
          group += r < rows ? input_value(input, in_dtype, size_t(r * cols + c)) : 0.0f;
        }
        tile += group;
      }
      total += tile;
    }
    if (out == FP8KIT_FLOAT32) {
      const float v = std::isnan(total) ? bits_float(0x7fc00000u) : total;
      std::memcpy(&bytes[size_t(c) * 4], &v, 4);
    } else {
      const uint16_t h = std::isnan(total) ? (out == FP8KIT_BFLOAT16 ? 0x7fc0 : 0x7e00)
                         : out == FP8KIT_BFLOAT16 ? ref_to_bf16(total)
                                                  : ref_to_fp16(total);
      std::memcpy(&bytes[size_t(c) * 2], &h, 2);
    }
  }
  return bytes;
}

// Compares two runs byte for byte (and their scalars).
inline void expect_same_result(const QuantResult& a, const QuantResult& b, const std::string& what) {
  ASSERT_EQ(a.status, FP8KIT_OK) << what << ": " << a.error;
  ASSERT_EQ(b.status, FP8KIT_OK) << what << ": " << b.error;
  ASSERT_EQ(a.data.size(), b.data.size()) << what;
  ASSERT_EQ(a.columnwise.size(), b.columnwise.size()) << what;
  for (size_t i = 0; i < a.data.size(); ++i) {
    if (a.data[i] != b.data[i]) {
      ADD_FAILURE() << what << ": rowwise byte " << i << " differs: 0x" << std::hex
                    << int(a.data[i]) << " vs 0x" << int(b.data[i]) << std::dec;
      break;
    }
  }
  for (size_t i = 0; i < a.columnwise.size(); ++i) {
    if (a.columnwise[i] != b.columnwise[i]) {
      ADD_FAILURE() << what << ": columnwise byte " << i << " differs: 0x" << std::hex
                    << int(a.columnwise[i]) << " vs 0x" << int(b.columnwise[i]) << std::dec;
      break;
    }
  }
  EXPECT_EQ(a.sums, b.sums) << what << ": column sums";
  EXPECT_EQ(a.sums_counters, b.sums_counters) << what << ": column-sum counters";
  EXPECT_TRUE(same_float(a.amax, b.amax)) << what << ": amax " << a.amax << " vs " << b.amax;
  EXPECT_TRUE(same_float(a.scale, b.scale)) << what << ": scale " << a.scale << " vs " << b.scale;
  EXPECT_TRUE(same_float(a.scale_inv, b.scale_inv))
      << what << ": scale_inv " << a.scale_inv << " vs " << b.scale_inv;
}

}  // namespace qtest

#endif  // FP8KIT_TESTS_CPP_QUANT_TEST_UTIL_H_
