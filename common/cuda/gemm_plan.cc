#include "gemm_plan.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>
#include <tuple>
#include <vector>

#include "block_scale_layout.h"
#include "gemm_autotune.h"
#include "gemm_check.h"
#include "validate.h"

namespace fp8kit {
namespace cuda {
namespace {

// How many heuristic results to ask for (and time, when autotuning):
// FP8KIT_GEMM_CANDIDATES (1..kMaxCandidates), default kDefaultCandidates.
constexpr int kMaxCandidates = 64;
// 32: for the MLP block's gradient GEMMs (8192 tokens, 4096 x 14336) the
// fastest kernel is past cuBLASLt's first 8 answers (a 1.53 ms 256x64 tile
// among them against 1.03 ms for 128x160), which saved about 200 us of a
// 8.6 ms step; timing 32 candidates costs about 0.25 s per new shape.
constexpr int kDefaultCandidates = 32;

int candidate_count() {
  static const int count = [] {
    const char* v = std::getenv("FP8KIT_GEMM_CANDIDATES");
    if (v == nullptr) return kDefaultCandidates;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || n < 1 || n > kMaxCandidates) {
      fail(FP8KIT_INVALID_ARGUMENT, "FP8KIT_GEMM_CANDIDATES=\"", v,
           "\" must be an integer from 1 to ", kMaxCandidates, "; unset it for the default ",
           kDefaultCandidates);
    }
    return int(n);
  }();
  return count;
}

cudaDataType_t cuda_dtype(fp8kit_dtype dtype) {
  switch (dtype) {
    case FP8KIT_FLOAT32: return CUDA_R_32F;
    case FP8KIT_BFLOAT16: return CUDA_R_16BF;
    case FP8KIT_FLOAT16: return CUDA_R_16F;
    case FP8KIT_E4M3: return CUDA_R_8F_E4M3;
    case FP8KIT_E5M2: return CUDA_R_8F_E5M2;
    default: fail(FP8KIT_INTERNAL, "gemm: no cudaDataType for dtype ", fp8kit_dtype_name(dtype));
  }
}

// Largest power of two (up to 256) dividing the address; NULL counts as 256.
uint32_t alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align >>= 1;
  return align;
}

cublasLtEpilogue_t cublas_epilogue(const GemmPlanKey& key) {
  switch (fp8kit_epilogue(key.epilogue)) {
    case FP8KIT_EPILOGUE_BIAS: return CUBLASLT_EPILOGUE_BIAS;
    case FP8KIT_EPILOGUE_GELU:
      return key.has_gelu_aux ? CUBLASLT_EPILOGUE_GELU_AUX : CUBLASLT_EPILOGUE_GELU;
    case FP8KIT_EPILOGUE_GELU_BIAS:
      return key.has_gelu_aux ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_BIAS;
    default: return CUBLASLT_EPILOGUE_DEFAULT;
  }
}

template <typename T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value,
              const char* what) {
  cublas_check(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)), what);
}

template <typename T>
void set_pref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
              const T& value, const char* what) {
  cublas_check(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)), what);
}

// Block-scaled operands: cuBLASLt's A is our B, its B our A (the mapping of
// gemm_plan.h). Only reached where fp8kit_supports_block_scaled_fp8_gemm
// holds, which needs a cuBLASLt that has these modes.
void set_block_scale_modes(cublasLtMatmulDesc_t desc, const GemmPlanKey& key) {
#if CUBLAS_VERSION >= 120900
  auto mode = [](int32_t scaling_mode) -> int32_t {
    return scaling_mode == FP8KIT_SCALING_BLOCK_1X128 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                                                      : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  };
  set_desc(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, mode(key.b_scaling_mode),
           "setting A_SCALE_MODE");
  set_desc(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, mode(key.a_scaling_mode),
           "setting B_SCALE_MODE");
#else
  (void)desc;
  (void)key;
  fail(FP8KIT_UNSUPPORTED, "gemm: this fp8kit was built against a cuBLASLt without block-scaled "
       "FP8 GEMMs (they need 12.9 or newer)");
#endif
}

bool autotune_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("FP8KIT_GEMM_AUTOTUNE");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

// FP8KIT_GEMM_LOG=1: one line on stderr per new plan, naming the shape,
// the candidate it runs and what each candidate took while timing, to set
// fp8kit's choice beside another library's kernel for the same GEMM.
bool plan_log_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("FP8KIT_GEMM_LOG");
    return v != nullptr && std::strcmp(v, "0") != 0 && v[0] != '\0';
  }();
  return enabled;
}

int32_t algo_config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  int32_t value = -1;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &value, sizeof(value), &written) !=
      CUBLAS_STATUS_SUCCESS) {
    return -1;
  }
  return value;
}

void log_plan(const GemmProblem& p, const GemmPlan& plan, const std::vector<float>& us) {
  std::ostringstream os;
  os << "fp8kit gemm plan: M=" << p.m << " N=" << p.n << " K=" << p.k << " A "
     << fp8kit_dtype_name(p.a.dtype) << (p.a.k_major ? "" : " (M-major)") << " B "
     << fp8kit_dtype_name(p.b.dtype) << (p.b.k_major ? "" : " (N-major)") << " D "
     << fp8kit_dtype_name(p.d_dtype) << " epilogue " << int(p.epilogue)
     << (p.fast_accumulation ? " fast" : " split") << " accumulation, beta " << p.beta
     << ": candidate " << plan.chosen << " of " << plan.candidates << " (algo "
     << algo_config(plan.algo, CUBLASLT_ALGO_CONFIG_ID) << ", tile "
     << algo_config(plan.algo, CUBLASLT_ALGO_CONFIG_TILE_ID) << ", stages "
     << algo_config(plan.algo, CUBLASLT_ALGO_CONFIG_STAGES_ID) << ")"
     << (plan.timed ? ", timed" : ", untimed")
     << (plan.provisional ? " (provisional, under graph capture)" : "");
  if (!us.empty()) {
    os << "; us per call:";
    char buf[32];
    for (float t : us) {
      std::snprintf(buf, sizeof(buf), " %.1f", double(t));
      os << buf;
    }
  }
  std::fprintf(stderr, "%s\n", os.str().c_str());
}

bool stream_is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return true;  // cannot tell: behave as under capture (no timing, no syncs)
  }
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace

bool GemmPlanKey::operator==(const GemmPlanKey& o) const {
  auto tie = [](const GemmPlanKey& k) {
    return std::tie(k.device, k.m, k.n, k.k, k.a_dtype, k.b_dtype, k.d_dtype, k.c_dtype,
                    k.bias_dtype, k.a_k_major, k.b_k_major, k.a_scaling_mode,
                    k.b_scaling_mode, k.epilogue, k.has_bias,
                    k.has_gelu_aux, k.has_amax, k.align_a, k.align_b, k.align_d,
                    k.fast_accumulation, k.beta_nonzero, k.workspace_bytes);
  };
  return tie(*this) == tie(o);
}

size_t GemmPlanKeyHash::operator()(const GemmPlanKey& k) const {
  size_t h = 0;
  auto mix = [&h](uint64_t v) { h ^= std::hash<uint64_t>()(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
  mix(uint64_t(k.device));
  mix(uint64_t(k.m));
  mix(uint64_t(k.n));
  mix(uint64_t(k.k));
  mix(uint64_t(k.a_dtype) | uint64_t(k.b_dtype) << 8 | uint64_t(k.d_dtype) << 16 |
      uint64_t(k.c_dtype) << 24 | uint64_t(k.bias_dtype) << 32 | uint64_t(k.epilogue) << 40);
  mix(uint64_t(k.a_k_major) | uint64_t(k.b_k_major) << 1 | uint64_t(k.has_bias) << 2 |
      uint64_t(k.has_gelu_aux) << 3 | uint64_t(k.has_amax) << 4 |
      uint64_t(k.fast_accumulation) << 5 | uint64_t(k.beta_nonzero) << 6);
  mix(uint64_t(k.align_a) | uint64_t(k.align_b) << 16 | uint64_t(k.align_d) << 32);
  mix(uint64_t(k.a_scaling_mode) | uint64_t(k.b_scaling_mode) << 8);
  mix(uint64_t(k.workspace_bytes));
  return h;
}

GemmPlanKey make_plan_key(const GemmProblem& p, size_t workspace_bytes) {
  GemmPlanKey key;
  std::memset(&key, 0, sizeof(key));  // padding too, though == and hash read fields only
  const bool d_fp8 = is_fp8(p.d_dtype);
  key.device = p.device_index;
  key.m = p.m;
  key.n = p.n;
  key.k = p.k;
  key.a_dtype = cuda_dtype(p.a.dtype);
  key.b_dtype = cuda_dtype(p.b.dtype);
  key.d_dtype = cuda_dtype(p.d_dtype);
  // cuBLASLt's FP8 table: an FP8 D takes a bf16 or fp16 C, matching the bias;
  // otherwise C is D (read in place when beta != 0).
  key.c_dtype = d_fp8 ? cuda_dtype(p.bias != nullptr ? p.bias_dtype : FP8KIT_BFLOAT16) : key.d_dtype;
  key.has_bias = p.bias != nullptr;
  key.bias_dtype = key.has_bias ? cuda_dtype(p.bias_dtype) : 0;
  key.a_k_major = p.a.k_major;
  key.b_k_major = p.b.k_major;
  key.a_scaling_mode = int32_t(p.a.scaling_mode);
  key.b_scaling_mode = int32_t(p.b.scaling_mode);
  key.epilogue = int32_t(p.epilogue);
  key.has_gelu_aux = p.gelu_aux != nullptr;
  key.has_amax = d_fp8 && p.d_amax != nullptr;
  key.align_a = alignment_of(p.a.data);
  key.align_b = alignment_of(p.b.data);
  key.align_d = alignment_of(p.d);
  key.fast_accumulation = p.fast_accumulation;
  key.beta_nonzero = p.beta != 0.0f;
  key.workspace_bytes = workspace_bytes;
  return key;
}

void init_matmul_desc(const GemmProblem& p, const GemmPlanKey& key,
                      cublasLtMatmulDescOpaque_t* storage) {
  cublasLtMatmulDesc_t desc = storage;
  cublas_check(cublasLtMatmulDescInit(desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescInit");
  // cuBLASLt's A is our B: K-major B is column-major [K, N], read transposed.
  const int32_t transa = key.b_k_major ? CUBLAS_OP_T : CUBLAS_OP_N;
  // cuBLASLt's B is our A: K-major A is column-major [K, M], read as is.
  const int32_t transb = key.a_k_major ? CUBLAS_OP_N : CUBLAS_OP_T;
  set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSA, transa, "setting TRANSA");
  set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSB, transb, "setting TRANSB");
  // Scale pointers are device pointers whatever the pointer mode: nothing
  // here synchronizes with the host.
  const void* a_scale = p.b.scale_inv;
  const void* b_scale = p.a.scale_inv;
  set_desc(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a_scale, "setting A_SCALE_POINTER");
  set_desc(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b_scale, "setting B_SCALE_POINTER");
  if (is_block_scaling(p.a.scaling_mode)) set_block_scale_modes(desc, key);
  if (is_fp8(p.d_dtype)) {
    const void* d_scale = p.d_scale;
    set_desc(desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, d_scale, "setting D_SCALE_POINTER");
    if (p.d_amax != nullptr) {
      void* amax = p.d_amax;
      set_desc(desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, amax, "setting AMAX_D_POINTER");
    }
  }
  const int8_t fast = p.fast_accumulation ? 1 : 0;
  set_desc(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast, "setting FAST_ACCUM");
  const uint32_t epilogue = cublas_epilogue(key);
  set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue, "setting EPILOGUE");
  if (key.has_bias) {
    const void* bias = p.bias;
    const int32_t bias_type = key.bias_dtype;
    set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, "setting BIAS_POINTER");
    set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type, "setting BIAS_DATA_TYPE");
  }
  if (key.has_gelu_aux) {
    void* aux = p.gelu_aux;
    const int64_t aux_ld = p.n;  // column-major [N, M] = our row-major [M, N]
    set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux, "setting EPILOGUE_AUX_POINTER");
    set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld, "setting EPILOGUE_AUX_LD");
  }
}

cublasStatus_t run_matmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const GemmPlan& plan,
                          const cublasLtMatmulAlgo_t& algo, const GemmProblem& p, void* d,
                          void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  // C is D (in place) for a high-precision D; an FP8 D has beta == 0 and a C
  // of another type, which cuBLASLt then never reads.
  const bool d_fp8 = is_fp8(p.d_dtype);
  void* c = d_fp8 ? nullptr : d;
  // cuBLASLt takes non-const layout handles but only reads them.
  auto layout = [](const cublasLtMatrixLayoutOpaque_t& l) {
    return const_cast<cublasLtMatrixLayout_t>(&l);
  };
  return cublasLtMatmul(handle, desc, &p.alpha, p.b.data, layout(plan.layout_a), p.a.data,
                        layout(plan.layout_b), &p.beta, c, layout(plan.layout_c), d,
                        layout(plan.layout_d), &algo, workspace, workspace_bytes, stream);
}

std::unique_ptr<GemmPlan> build_plan(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                     const GemmProblem& p, const GemmPlanKey& key,
                                     void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  std::unique_ptr<GemmPlan> plan(new GemmPlan);
  std::memset(plan.get(), 0, sizeof(GemmPlan));
  const uint64_t m = uint64_t(p.m), n = uint64_t(p.n), k = uint64_t(p.k);
  // cuBLASLt A = our B: [K, N] column-major (ld K) when K-major, else [N, K] (ld N).
  if (key.b_k_major) {
    cublas_check(cublasLtMatrixLayoutInit(&plan->layout_a, cudaDataType_t(key.b_dtype), k, n, int64_t(k)),
                 "cublasLtMatrixLayoutInit(A)");
  } else {
    cublas_check(cublasLtMatrixLayoutInit(&plan->layout_a, cudaDataType_t(key.b_dtype), n, k, int64_t(n)),
                 "cublasLtMatrixLayoutInit(A)");
  }
  // cuBLASLt B = our A: [K, M] column-major (ld K) when K-major, else [M, K] (ld M).
  if (key.a_k_major) {
    cublas_check(cublasLtMatrixLayoutInit(&plan->layout_b, cudaDataType_t(key.a_dtype), k, m, int64_t(k)),
                 "cublasLtMatrixLayoutInit(B)");
  } else {
    cublas_check(cublasLtMatrixLayoutInit(&plan->layout_b, cudaDataType_t(key.a_dtype), m, k, int64_t(m)),
                 "cublasLtMatrixLayoutInit(B)");
  }
  cublas_check(cublasLtMatrixLayoutInit(&plan->layout_c, cudaDataType_t(key.c_dtype), n, m, int64_t(n)),
               "cublasLtMatrixLayoutInit(C)");
  cublas_check(cublasLtMatrixLayoutInit(&plan->layout_d, cudaDataType_t(key.d_dtype), n, m, int64_t(n)),
               "cublasLtMatrixLayoutInit(D)");

  cublasLtMatmulPreferenceOpaque_t pref_storage;
  cublasLtMatmulPreference_t pref = &pref_storage;
  cublas_check(cublasLtMatmulPreferenceInit(pref), "cublasLtMatmulPreferenceInit");
  const uint64_t max_ws = workspace_bytes;
  set_pref(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, max_ws, "setting MAX_WORKSPACE_BYTES");
  // Tell the heuristic how aligned the buffers really are, so it only offers
  // kernels that can run on them (and the widest-load kernels when it can).
  const uint32_t align_c = is_fp8(p.d_dtype) ? 256u : key.align_d;
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b, "setting MIN_ALIGNMENT_A");
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a, "setting MIN_ALIGNMENT_B");
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c, "setting MIN_ALIGNMENT_C");
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d, "setting MIN_ALIGNMENT_D");

  cublasLtMatmulHeuristicResult_t results[kMaxCandidates];
  std::memset(results, 0, sizeof(results));
  int returned = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
      handle, desc, &plan->layout_a, &plan->layout_b, &plan->layout_c, &plan->layout_d, pref,
      candidate_count(), results, &returned);
  std::vector<cublasLtMatmulHeuristicResult_t> candidates;
  if (st == CUBLAS_STATUS_SUCCESS) {
    for (int i = 0; i < returned; ++i) {
      if (results[i].state == CUBLAS_STATUS_SUCCESS && results[i].workspaceSize <= workspace_bytes) {
        candidates.push_back(results[i]);
      }
    }
  }
  if (candidates.empty()) {
    fail(FP8KIT_CUBLAS_ERROR, "gemm: cuBLASLt has no kernel for this FP8 GEMM (M=", p.m, ", N=", p.n,
         ", K=", p.k, ", A ", fp8kit_dtype_name(p.a.dtype), ", B ", fp8kit_dtype_name(p.b.dtype),
         ", D ", fp8kit_dtype_name(p.d_dtype), ", epilogue ", int(p.epilogue),
         key.has_gelu_aux ? " with gelu_aux" : "", ", ", workspace_bytes,
         " workspace bytes): cublasLtMatmulAlgoGetHeuristic returned ", cublasLtGetStatusName(st),
         " with ", returned, " results");
  }
  plan->candidates = int(candidates.size());
  int chosen = 0;
  std::vector<float> us_per_call;
  plan->timed = false;
  plan->provisional = false;
  if (candidates.size() > 1 && p.autotune && autotune_enabled()) {
    if (stream_is_capturing(stream)) {
      // No timing (or syncs) inside a CUDA graph capture: use the
      // heuristic's first choice now and tune at the first eager call.
      plan->provisional = true;
    } else {
      std::vector<cublasLtMatmulAlgo_t> algos;
      for (const auto& c : candidates) algos.push_back(c.algo);
      chosen = pick_fastest_algo(handle, desc, *plan, algos, p, workspace, workspace_bytes, stream,
                                 plan_log_enabled() ? &us_per_call : nullptr);
      plan->timed = true;
    }
  }
  plan->chosen = chosen;
  plan->algo = candidates[size_t(chosen)].algo;
  plan->algo_workspace_bytes = candidates[size_t(chosen)].workspaceSize;
  if (plan_log_enabled()) log_plan(p, *plan, us_per_call);
  return plan;
}

}  // namespace cuda
}  // namespace fp8kit
