// Helpers of the GEMM tests (gemm_test.cc, gemm_plan_cache_test.cc): random
// FP8 operands, an independent float64 reference GEMM, and running one case
// through fp8kit_gemm on the CPU or a GPU.
//
// Independence: FP8 bytes are decoded here with ldexp (not fp8_convert.h),
// and the reference multiplies in double from those decoded values. The
// operands' bytes themselves come from fp8_convert.h, which only decides
// which inputs are tested.
#ifndef FP8KIT_TESTS_CPP_GEMM_TEST_UTIL_H_
#define FP8KIT_TESTS_CPP_GEMM_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fp8_convert.h"
#include "reference_decode.h"
#include "fp8kit/fp8kit.h"

#ifdef FP8KIT_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace fp8kit_test {

// ------------------------------------------------------------ host memory --

// Heap memory aligned to 256 bytes (FP8 GEMMs need 16-byte aligned buffers;
// std::vector only promises alignof(T)).
class HostBuffer {
 public:
  HostBuffer() = default;
  explicit HostBuffer(size_t bytes) : bytes_(bytes) {
    ptr_ = std::aligned_alloc(256, std::max<size_t>(256, (bytes + 255) / 256 * 256));
    std::memset(ptr_, 0, bytes);
  }
  ~HostBuffer() { std::free(ptr_); }
  HostBuffer(HostBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  HostBuffer& operator=(HostBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  HostBuffer(const HostBuffer&) = delete;
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// ------------------------------------------------- independent decoding --

using testref::decode_fp8;
inline double decode_half(uint16_t h) { return testref::decode_fp16(h); }

inline double decode_bf16(uint16_t h) {
  const uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Element i of a bf16/fp16/fp32 buffer, or of an FP8 buffer dequantized
// with `scale_inv`.
inline double read_element(const void* data, fp8kit_dtype dtype, size_t i, double scale_inv = 1.0) {
  switch (dtype) {
    case FP8KIT_FLOAT32: return static_cast<const float*>(data)[i];
    case FP8KIT_BFLOAT16: return decode_bf16(static_cast<const uint16_t*>(data)[i]);
    case FP8KIT_FLOAT16: return decode_half(static_cast<const uint16_t*>(data)[i]);
    default: return decode_fp8(static_cast<const uint8_t*>(data)[i], dtype) * scale_inv;
  }
}

// Writes a value that is exactly representable in `dtype` (the tests only
// write multiples of 1/8 below 64 in magnitude, exact in all three).
inline void write_exact(void* data, fp8kit_dtype dtype, size_t i, double v) {
  if (dtype == FP8KIT_FLOAT32) {
    static_cast<float*>(data)[i] = float(v);
    return;
  }
  if (dtype == FP8KIT_BFLOAT16) {
    const float f = float(v);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    static_cast<uint16_t*>(data)[i] = uint16_t(bits >> 16);
    return;
  }
  // binary16, normal or zero
  uint16_t h = 0;
  if (v != 0.0) {
    int e;
    const double frac = std::frexp(std::fabs(v), &e);  // |v| = frac * 2^e, frac in [0.5, 1)
    h = uint16_t(((e - 1 + 15) << 10) | int((frac * 2.0 - 1.0) * 1024.0));
    if (v < 0) h |= 0x8000;
  }
  static_cast<uint16_t*>(data)[i] = h;
}

// ------------------------------------------------------------- operands --

// A random FP8 matrix with its logical shape [rows, cols], its rowwise
// bytes, its columnwise bytes ([cols, rows]) and its float64 value.
struct Fp8Matrix {
  int64_t rows = 0, cols = 0;
  fp8kit_dtype dtype = FP8KIT_E4M3;
  float scale_inv = 1.0f;
  HostBuffer rowwise;
  HostBuffer columnwise;
  std::vector<double> value;  // dequantized, row-major [rows, cols]
};

inline Fp8Matrix make_fp8_matrix(int64_t rows, int64_t cols, fp8kit_dtype dtype, float scale_inv,
                                 uint32_t seed) {
  Fp8Matrix x;
  x.rows = rows;
  x.cols = cols;
  x.dtype = dtype;
  x.scale_inv = scale_inv;
  const size_t n = size_t(rows * cols);
  x.rowwise = HostBuffer(n);
  x.columnwise = HostBuffer(n);
  x.value.resize(n);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t q = fp8kit::float_to_fp8_bits(normal(rng), dtype);
      x.rowwise.as<uint8_t>()[r * cols + c] = q;
      x.columnwise.as<uint8_t>()[c * rows + r] = q;
      x.value[size_t(r * cols + c)] = decode_fp8(q, dtype) * double(scale_inv);
    }
  }
  return x;
}

// ----------------------------------------------------------------- cases --

struct GemmCase {
  int64_t m = 33, n = 48, k = 64;
  int trans_a = 0, trans_b = 1;
  fp8kit_dtype a_dtype = FP8KIT_E4M3, b_dtype = FP8KIT_E4M3, d_dtype = FP8KIT_BFLOAT16;
  float alpha = 1.0f, beta = 0.0f;
  fp8kit_epilogue epilogue = FP8KIT_EPILOGUE_DEFAULT;
  fp8kit_dtype bias_dtype = FP8KIT_BFLOAT16;
  bool gelu_aux = false;
  int use_split_accumulator = 1;
  bool a_rowwise = true, a_columnwise = true, b_rowwise = true, b_columnwise = true;
  uint32_t seed = 1;

  std::string name() const {
    std::string s = "m" + std::to_string(m) + "n" + std::to_string(n) + "k" + std::to_string(k) +
                    " ta" + std::to_string(trans_a) + " tb" + std::to_string(trans_b) + " " +
                    fp8kit_dtype_name(a_dtype) + "x" + fp8kit_dtype_name(b_dtype) + "->" +
                    fp8kit_dtype_name(d_dtype) + " ep" + std::to_string(int(epilogue));
    if (gelu_aux) s += "+aux";
    if (beta != 0.0f) s += " beta";
    if (!use_split_accumulator) s += " fast";
    return s;
  }
};

// Host inputs of a case: operands in their logical shapes (A is [K, M] when
// trans_a, B is [K, N] when !trans_b), bias, the old D for beta, and D's
// quantization scale for an FP8 D.
struct GemmInputs {
  Fp8Matrix a, b;
  std::vector<double> bias;   // [N], multiples of 1/8
  std::vector<double> d_old;  // [M, N], multiples of 1/8
  float d_scale = 1.0f;
};

inline bool is_fp8_dtype(fp8kit_dtype d) { return d == FP8KIT_E4M3 || d == FP8KIT_E5M2; }

inline double gelu_reference(double x) {
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

// op(A)[i, kk] and op(B)[kk, j] from the logical matrices.
inline double op_a(const GemmCase& c, const GemmInputs& in, int64_t i, int64_t kk) {
  return c.trans_a ? in.a.value[size_t(kk * c.m + i)] : in.a.value[size_t(i * c.k + kk)];
}
inline double op_b(const GemmCase& c, const GemmInputs& in, int64_t kk, int64_t j) {
  return c.trans_b ? in.b.value[size_t(j * c.k + kk)] : in.b.value[size_t(kk * c.n + j)];
}

struct Reference {
  std::vector<double> d;        // final value of D (before FP8 quantization)
  std::vector<double> pre_gelu; // value before GELU
  std::vector<double> magnitude;  // sum |a||b| * |alpha| + |beta d_old| + |bias|: error scale
};

inline Reference reference_gemm(const GemmCase& c, const GemmInputs& in) {
  Reference r;
  const size_t mn = size_t(c.m * c.n);
  r.d.resize(mn);
  r.pre_gelu.resize(mn);
  r.magnitude.resize(mn);
  const bool has_bias = c.epilogue == FP8KIT_EPILOGUE_BIAS || c.epilogue == FP8KIT_EPILOGUE_GELU_BIAS;
  const bool has_gelu = c.epilogue == FP8KIT_EPILOGUE_GELU || c.epilogue == FP8KIT_EPILOGUE_GELU_BIAS;
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double acc = 0.0, mag = 0.0;
      for (int64_t kk = 0; kk < c.k; ++kk) {
        const double p = op_a(c, in, i, kk) * op_b(c, in, kk, j);
        acc += p;
        mag += std::fabs(p);
      }
      const size_t idx = size_t(i * c.n + j);
      double x = double(c.alpha) * acc;
      mag *= std::fabs(double(c.alpha));
      if (c.beta != 0.0f) {
        x += double(c.beta) * in.d_old[idx];
        mag += std::fabs(double(c.beta) * in.d_old[idx]);
      }
      if (has_bias) {
        x += in.bias[size_t(j)];
        mag += std::fabs(in.bias[size_t(j)]);
      }
      r.pre_gelu[idx] = x;
      r.d[idx] = has_gelu ? gelu_reference(x) : x;
      r.magnitude[idx] = mag;
    }
  }
  return r;
}

inline GemmInputs make_inputs(const GemmCase& c) {
  GemmInputs in;
  in.a = c.trans_a ? make_fp8_matrix(c.k, c.m, c.a_dtype, 0.25f, c.seed)
                   : make_fp8_matrix(c.m, c.k, c.a_dtype, 0.25f, c.seed);
  in.b = c.trans_b ? make_fp8_matrix(c.n, c.k, c.b_dtype, 0.125f, c.seed + 1000)
                   : make_fp8_matrix(c.k, c.n, c.b_dtype, 0.125f, c.seed + 1000);
  std::mt19937 rng(c.seed + 2000);
  std::uniform_int_distribution<int> eighths(-200, 200);
  in.bias.resize(size_t(c.n));
  for (auto& v : in.bias) v = eighths(rng) / 8.0;
  in.d_old.resize(size_t(c.m * c.n));
  for (auto& v : in.d_old) v = eighths(rng) / 8.0;
  if (is_fp8_dtype(c.d_dtype)) {
    // Scale D so its largest value lands at half the format's range.
    double amax = 0.0;
    for (double v : reference_gemm(c, in).d) amax = std::max(amax, std::fabs(v));
    in.d_scale = float(0.5 * fp8kit_fp8_max(c.d_dtype) / std::max(amax, 1e-3));
  }
  return in;
}

// What one fp8kit_gemm call produced, read back to the host.
struct GemmOutputs {
  fp8kit_status status = FP8KIT_INTERNAL;
  std::string error;
  std::vector<double> d;    // dequantized for an FP8 D
  std::vector<double> aux;  // gelu_aux, when asked for
  float amax = NAN;
  float scale_inv = NAN;
};

// Builds the descriptors for a case around already-placed buffers.
struct CaseBuffers {
  void* a_rowwise = nullptr;
  void* a_columnwise = nullptr;
  void* b_rowwise = nullptr;
  void* b_columnwise = nullptr;
  float* a_scale_inv = nullptr;
  float* b_scale_inv = nullptr;
  void* d = nullptr;
  float* d_scale = nullptr;
  float* d_amax = nullptr;
  float* d_scale_inv = nullptr;
  void* bias = nullptr;
  void* aux = nullptr;
};

inline fp8kit_tensor operand_descriptor(fp8kit_device_type dev, int index, const Fp8Matrix& x,
                                        void* rowwise, void* columnwise, float* scale_inv) {
  const int64_t shape[2] = {x.rows, x.cols};
  fp8kit_tensor t = fp8kit_tensor_make(dev, index, x.dtype, 2, shape, rowwise);
  t.columnwise_data = columnwise;
  t.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  t.scale_inv = scale_inv;
  return t;
}

// The three descriptors and the config of one call; tests may edit them
// before calling fp8kit_gemm.
struct GemmArgs {
  fp8kit_tensor a, b, d;
  fp8kit_gemm_config cfg;
  fp8kit_status call(void* stream = nullptr) { return fp8kit_gemm(&a, &b, &d, &cfg, stream); }
};

inline GemmArgs make_args(const GemmCase& c, fp8kit_device_type dev, int index,
                          const GemmInputs& in, const CaseBuffers& buf, void* workspace = nullptr,
                          size_t workspace_bytes = 0) {
  GemmArgs g;
  g.a = operand_descriptor(dev, index, in.a, c.a_rowwise ? buf.a_rowwise : nullptr,
                           c.a_columnwise ? buf.a_columnwise : nullptr, buf.a_scale_inv);
  g.b = operand_descriptor(dev, index, in.b, c.b_rowwise ? buf.b_rowwise : nullptr,
                           c.b_columnwise ? buf.b_columnwise : nullptr, buf.b_scale_inv);
  const int64_t dshape[2] = {c.m, c.n};
  g.d = fp8kit_tensor_make(dev, index, c.d_dtype, 2, dshape, buf.d);
  if (is_fp8_dtype(c.d_dtype)) {
    g.d.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
    g.d.scale = buf.d_scale;
    g.d.amax = buf.d_amax;
    g.d.scale_inv = buf.d_scale_inv;
  }
  fp8kit_gemm_config& cfg = g.cfg;
  cfg = fp8kit_gemm_config_default();
  cfg.trans_a = c.trans_a;
  cfg.trans_b = c.trans_b;
  cfg.alpha = c.alpha;
  cfg.beta = c.beta;
  cfg.epilogue = c.epilogue;
  if (c.epilogue == FP8KIT_EPILOGUE_BIAS || c.epilogue == FP8KIT_EPILOGUE_GELU_BIAS) {
    cfg.bias = buf.bias;
    cfg.bias_dtype = c.bias_dtype;
    cfg.bias_numel = c.n;
  }
  if (c.gelu_aux) {
    cfg.gelu_aux = buf.aux;
    cfg.gelu_aux_numel = c.m * c.n;
  }
  cfg.use_split_accumulator = c.use_split_accumulator;
  cfg.workspace = workspace;
  cfg.workspace_bytes = workspace_bytes;
  return g;
}

inline fp8kit_status call_gemm(const GemmCase& c, fp8kit_device_type dev, int index,
                               const GemmInputs& in, const CaseBuffers& buf, void* stream,
                               void* workspace = nullptr, size_t workspace_bytes = 0) {
  GemmArgs g = make_args(c, dev, index, in, buf, workspace, workspace_bytes);
  return g.call(stream);
}

// Host-side byte images of a case's D (old contents), bias and aux.
struct HostSide {
  HostBuffer d, bias, aux;
  // Each scalar 16-byte aligned, as the GEMM requires of scale pointers.
  alignas(16) float a_scale_inv;
  alignas(16) float b_scale_inv;
  alignas(16) float d_scale;
  alignas(16) float d_amax = -1.0f;
  alignas(16) float d_scale_inv = -1.0f;
};

inline HostSide host_side(const GemmCase& c, const GemmInputs& in) {
  HostSide h;
  const size_t mn = size_t(c.m * c.n);
  h.d = HostBuffer(std::max<size_t>(1, mn * fp8kit_dtype_size(c.d_dtype)));
  if (!is_fp8_dtype(c.d_dtype)) {
    for (size_t i = 0; i < mn; ++i) {
      // beta == 0 must not read D: fill it with NaN then.
      if (c.beta != 0.0f) {
        write_exact(h.d.get(), c.d_dtype, i, in.d_old[i]);
      } else if (c.d_dtype == FP8KIT_FLOAT32) {
        h.d.as<float>()[i] = NAN;
      } else {
        h.d.as<uint16_t>()[i] = 0x7fff;  // NaN in both bf16 and fp16
      }
    }
  }
  h.bias = HostBuffer(std::max<size_t>(1, size_t(c.n) * fp8kit_dtype_size(c.bias_dtype)));
  for (size_t j = 0; j < size_t(c.n); ++j) write_exact(h.bias.get(), c.bias_dtype, j, in.bias[j]);
  h.aux = HostBuffer(std::max<size_t>(1, mn * fp8kit_dtype_size(c.d_dtype)));
  h.a_scale_inv = in.a.scale_inv;
  h.b_scale_inv = in.b.scale_inv;
  h.d_scale = in.d_scale;
  return h;
}

inline void read_outputs(const GemmCase& c, const void* d, const void* aux, float amax,
                         float scale_inv, double d_scale, GemmOutputs* out) {
  const size_t mn = size_t(c.m * c.n);
  out->d.resize(mn);
  for (size_t i = 0; i < mn; ++i) out->d[i] = read_element(d, c.d_dtype, i, 1.0 / d_scale);
  if (c.gelu_aux) {
    out->aux.resize(mn);
    for (size_t i = 0; i < mn; ++i) out->aux[i] = read_element(aux, c.d_dtype, i);
  }
  out->amax = amax;
  out->scale_inv = scale_inv;
}

// A case set up on the CPU: inputs, host buffers and ready-made arguments
// (edit `args` to test validation).
struct CpuCase {
  GemmCase c;
  GemmInputs in;
  HostSide h;
  CaseBuffers buf;
  GemmArgs args;

  explicit CpuCase(const GemmCase& c_) : c(c_), in(make_inputs(c_)), h(host_side(c_, in)) {
    buf.a_rowwise = in.a.rowwise.get();
    buf.a_columnwise = in.a.columnwise.get();
    buf.b_rowwise = in.b.rowwise.get();
    buf.b_columnwise = in.b.columnwise.get();
    buf.a_scale_inv = &h.a_scale_inv;
    buf.b_scale_inv = &h.b_scale_inv;
    buf.d = h.d.get();
    buf.d_scale = &h.d_scale;
    buf.d_amax = &h.d_amax;
    buf.d_scale_inv = &h.d_scale_inv;
    buf.bias = h.bias.get();
    buf.aux = h.aux.get();
    args = make_args(c, FP8KIT_DEVICE_CPU, 0, in, buf);
  }
  CpuCase(const CpuCase&) = delete;

  GemmOutputs run() {
    GemmOutputs out;
    out.status = args.call();
    out.error = fp8kit_last_error();
    if (out.status == FP8KIT_OK) {
      read_outputs(c, h.d.get(), h.aux.get(), h.d_amax, h.d_scale_inv, h.d_scale, &out);
    }
    return out;
  }
};

inline GemmOutputs run_cpu(const GemmCase& c) {
  CpuCase cc(c);
  return cc.run();
}

// Rounding bound of one output element stored in `dtype` (relative).
inline double output_eps(fp8kit_dtype dtype) {
  switch (dtype) {
    case FP8KIT_FLOAT32: return std::ldexp(1.0, -23);
    case FP8KIT_BFLOAT16: return std::ldexp(1.0, -8);
    case FP8KIT_FLOAT16: return std::ldexp(1.0, -10);
    case FP8KIT_E4M3: return std::ldexp(1.0, -3);
    default: return std::ldexp(1.0, -2);  // E5M2
  }
}

// Smallest step of `dtype` in D's (dequantized) units: the absolute error of
// a value that rounds into the denormal range.
inline double output_abs_step(fp8kit_dtype dtype, double d_scale) {
  switch (dtype) {
    case FP8KIT_FLOAT16: return std::ldexp(1.0, -24);
    case FP8KIT_E4M3: return std::ldexp(1.0, -9) / d_scale;
    case FP8KIT_E5M2: return std::ldexp(1.0, -16) / d_scale;
    default: return 1e-30;
  }
}

// Expects got[i] within rel * |want[i]| + extra[i] + abs of want[i].
inline void expect_close(const std::vector<double>& got, const std::vector<double>& want,
                         double rel, const std::vector<double>& extra, double abs,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = rel * std::fabs(want[i]) + (extra.empty() ? 0.0 : extra[i]) + abs;
    if (!(std::fabs(got[i] - want[i]) <= tol)) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", expected " << want[i]
                    << " (tolerance " << tol << ")";
      if (++reported >= 5) return;
    }
  }
}

#ifdef FP8KIT_WITH_CUDA
// ---------------------------------------------------------- device memory --

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) {
    EXPECT_EQ(cudaMalloc(&ptr_, std::max<size_t>(bytes, 256)), cudaSuccess);
  }
  DeviceBuffer(const void* host, size_t bytes) : DeviceBuffer(bytes) {
    EXPECT_EQ(cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_) { o.ptr_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

// A case's buffers on GPU `device`, filled from the host images.
constexpr int kScalarStride = 4;  // floats: 16 bytes

struct DeviceCase {
  DeviceBuffer a_rowwise, a_columnwise, b_rowwise, b_columnwise, scalars, d, bias, aux;
  CaseBuffers buf;

  DeviceCase(const GemmCase& c, const GemmInputs& in, const HostSide& h) {
    const size_t a_bytes = size_t(in.a.rows * in.a.cols), b_bytes = size_t(in.b.rows * in.b.cols);
    a_rowwise = DeviceBuffer(in.a.rowwise.get(), a_bytes);
    a_columnwise = DeviceBuffer(in.a.columnwise.get(), a_bytes);
    b_rowwise = DeviceBuffer(in.b.rowwise.get(), b_bytes);
    b_columnwise = DeviceBuffer(in.b.columnwise.get(), b_bytes);
    // One scalar per 16 bytes: cuBLASLt needs 16-byte aligned scale pointers.
    float host_scalars[kScalarStride * 5] = {};
    const float values[5] = {h.a_scale_inv, h.b_scale_inv, h.d_scale, h.d_amax, h.d_scale_inv};
    for (int i = 0; i < 5; ++i) host_scalars[i * kScalarStride] = values[i];
    scalars = DeviceBuffer(host_scalars, sizeof(host_scalars));
    d = DeviceBuffer(h.d.get(), h.d.bytes());
    bias = DeviceBuffer(h.bias.get(), h.bias.bytes());
    aux = DeviceBuffer(h.aux.get(), h.aux.bytes());
    buf.a_rowwise = a_rowwise.get();
    buf.a_columnwise = a_columnwise.get();
    buf.b_rowwise = b_rowwise.get();
    buf.b_columnwise = b_columnwise.get();
    buf.a_scale_inv = scalars.as<float>();
    buf.b_scale_inv = scalars.as<float>() + 1 * kScalarStride;
    buf.d_scale = scalars.as<float>() + 2 * kScalarStride;
    buf.d_amax = scalars.as<float>() + 3 * kScalarStride;
    buf.d_scale_inv = scalars.as<float>() + 4 * kScalarStride;
    buf.d = d.get();
    buf.bias = bias.get();
    buf.aux = aux.get();
    (void)c;
  }

  // Copies D, aux, amax and scale_inv back (synchronizing `stream` first).
  void read(const GemmCase& c, const HostSide& h, cudaStream_t stream, GemmOutputs* out) {
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    HostBuffer hd(h.d.bytes()), haux(h.aux.bytes());
    float sc[kScalarStride * 5];
    EXPECT_EQ(cudaMemcpy(hd.get(), d.get(), h.d.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(haux.get(), aux.get(), h.aux.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(sc, scalars.get(), sizeof(sc), cudaMemcpyDeviceToHost), cudaSuccess);
    read_outputs(c, hd.get(), haux.get(), sc[3 * kScalarStride], sc[4 * kScalarStride], h.d_scale,
                 out);
  }
};

inline GemmOutputs run_cuda(const GemmCase& c, const GemmInputs& in, int device = 0,
                            cudaStream_t stream = nullptr, void* workspace = nullptr,
                            size_t workspace_bytes = 0) {
  EXPECT_EQ(cudaSetDevice(device), cudaSuccess);
  HostSide h = host_side(c, in);
  DeviceCase dc(c, in, h);
  GemmOutputs out;
  out.status = call_gemm(c, FP8KIT_DEVICE_CUDA, device, in, dc.buf, stream, workspace, workspace_bytes);
  out.error = fp8kit_last_error();
  if (out.status == FP8KIT_OK) dc.read(c, h, stream, &out);
  return out;
}
#endif  // FP8KIT_WITH_CUDA

}  // namespace fp8kit_test

#endif  // FP8KIT_TESTS_CPP_GEMM_TEST_UTIL_H_
