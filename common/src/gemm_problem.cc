// fp8kit_gemm's validation and TN canonicalization (see gemm_problem.h).
#include "gemm_problem.h"

#include <cstdint>
#include <string>

#include "block_scale_layout.h"
#include "error.h"
#include "gemm_block_rules.h"
#include "fp8kit/device.h"
#include "fp8kit/linear.h"
#include "fp8kit/status.h"
#include "quantize_validate.h"
#include "validate.h"

namespace fp8kit {
namespace {

constexpr const char* kOp = "gemm";

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// cuBLASLt reads the scale and amax scalars with 16-byte accesses: a scale
// pointer 4 or 8 bytes past a 16-byte boundary makes cublasLtMatmul return
// CUBLAS_STATUS_NOT_SUPPORTED (seen with cuBLASLt 13.1 on an H200), so such
// pointers are refused up front, on the CPU too.
void check_scalar_aligned16(const char* tensor, const char* field, const void* p) {
  FP8KIT_CHECK(aligned(p, 16), "gemm: ", tensor, "'s ", field, " pointer ", p,
               " is not 16-byte aligned; cuBLASLt needs scale and amax scalars at 16-byte "
               "aligned addresses: give each its own allocation instead of packing them");
}

void check_aligned16(const char* what, const void* p) {
  FP8KIT_CHECK(aligned(p, 16), "gemm: ", what, " pointer ", p,
               " is not 16-byte aligned; FP8 GEMM (cuBLASLt) needs 16-byte aligned buffers: pass a "
               "fresh allocation or a contiguous copy instead of an offset view");
}

// The one copy of the layout rule: asks the cached per-device capability
// query whether the device reads FP8 operands in non-TN layouts.
bool device_runs_non_tn(fp8kit_device_type type, int index) {
  int supported = 0;
  const fp8kit_status st = fp8kit_supports_non_tn_fp8_gemm(type, index, &supported);
  if (st != FP8KIT_OK) fail(st, fp8kit_last_error());
  return supported != 0;
}

// Picks rowwise or columnwise data of one operand. `rowwise_k_major` says
// whether the rowwise data is already [rows, K] (A with trans_a=0, B with
// trans_b=1); the columnwise copy always has the other orientation.
GemmOperand pick_data(const char* name, const char* trans_name, int trans,
                      const fp8kit_tensor& t, bool rowwise_k_major, bool non_tn, int64_t rows,
                      int64_t k, const char* rows_name) {
  GemmOperand op;
  op.dtype = t.dtype;
  const bool has_row = t.data != nullptr;
  const bool has_col = t.columnwise_data != nullptr;
  if (rows == 0 || k == 0) {  // nothing is read
    op.data = has_row ? t.data : t.columnwise_data;
    op.k_major = true;
    op.from_columnwise = !has_row && has_col;
    return op;
  }
  FP8KIT_CHECK(has_row || has_col, "gemm: ", name, " has neither rowwise data nor columnwise data");
  if (!non_tn) {
    // TN-only device: the operand must be read K-contiguous.
    if (rowwise_k_major) {
      FP8KIT_CHECK(has_row, "gemm: ", name, " must be read as stored (", trans_name, "=", trans,
                   ") but ", name, " has no rowwise data; quantize ", name, " with rowwise=True");
      op.data = t.data;
      op.from_columnwise = false;
    } else {
      FP8KIT_CHECK(has_col, "gemm: ", name, " must be read transposed (", trans_name, "=", trans,
                   ") but ", name, " has no columnwise data; quantize ", name,
                   " with columnwise=True (this device runs FP8 GEMMs only with both operands "
                   "K-contiguous, the TN layout, so ", name, " is read from its transposed copy)");
      op.data = t.columnwise_data;
      op.from_columnwise = true;
    }
    op.k_major = true;
  } else if (has_row) {
    op.data = t.data;
    op.from_columnwise = false;
    op.k_major = rowwise_k_major;
  } else {
    op.data = t.columnwise_data;
    op.from_columnwise = true;
    op.k_major = !rowwise_k_major;
  }
  if (!op.k_major) {
    // Read [K, rows]: the leading dimension is `rows`.
    FP8KIT_CHECK(rows % FP8KIT_GEMM_DIM_MULTIPLE == 0, "gemm: ", name, " is read with ",
                 rows_name, " contiguous, so FP8 GEMM needs ", rows_name, " (", rows,
                 ") to be a multiple of ", FP8KIT_GEMM_DIM_MULTIPLE,
                 "; pad it or provide the other data layout of ", name);
  }
  const std::string what = std::string(name) + (op.from_columnwise ? "'s columnwise data" : "'s data");
  check_aligned16(what.c_str(), op.data);
  return op;
}

// Block-scaled operands are always read K-contiguous (`non_tn` false) and
// come with the block scales of the copy read.
GemmOperand pick_operand(const char* name, const char* trans_name, int trans,
                         const fp8kit_tensor& t, bool rowwise_k_major, bool non_tn,
                         int64_t rows, int64_t k, const char* rows_name) {
  GemmOperand op = pick_data(name, trans_name, trans, t, rowwise_k_major, non_tn, rows, k,
                             rows_name);
  op.scaling_mode = t.scaling_mode;
  op.scale_inv = t.scale_inv;
  if (is_block_scaling(t.scaling_mode)) {
    op.scale_inv = rows == 0 ? nullptr : block_scales_of(name, t, op.from_columnwise);
  }
  return op;
}

void check_operand_descriptor(const char* name, const fp8kit_tensor& t) {
  FP8KIT_CHECK(is_fp8(t.dtype), "gemm: ", name, " has dtype ", fp8kit_dtype_name(t.dtype),
               "; FP8 GEMM operands must be e4m3 or e5m2 (quantize ", name, " first)");
  FP8KIT_CHECK(t.rank >= 1, "gemm: ", name, " has rank 0; GEMM operands need rank >= 1");
  if (is_block_scaling(t.scaling_mode)) return;  // scales checked with the copy read
  FP8KIT_CHECK(t.scaling_mode == FP8KIT_SCALING_PER_TENSOR, "gemm: ", name, " has ",
               scaling_mode_name(t.scaling_mode), " (", int(t.scaling_mode),
               "); FP8 GEMM operands need per-tensor scaling (FP8KIT_SCALING_PER_TENSOR) with "
               "scale_inv, or block scaling (FP8KIT_SCALING_BLOCK_1X128 / _128X128)");
  FP8KIT_CHECK(t.scale_inv != nullptr, "gemm: ", name,
               " has no scale_inv; the GEMM dequantizes with it (x = q * scale_inv)");
  check_scalar_aligned16(name, "scale_inv", t.scale_inv);
}

// Bias dtypes cuBLASLt accepts for each D dtype (its FP8 type table).
bool bias_dtype_ok(fp8kit_dtype d, fp8kit_dtype bias) {
  switch (d) {
    case FP8KIT_BFLOAT16: return bias == FP8KIT_BFLOAT16;
    case FP8KIT_FLOAT16: return bias == FP8KIT_FLOAT16;
    case FP8KIT_FLOAT32: return bias == FP8KIT_BFLOAT16;
    case FP8KIT_E4M3:
    case FP8KIT_E5M2: return bias == FP8KIT_BFLOAT16 || bias == FP8KIT_FLOAT16;
    default: return false;
  }
}

const char* allowed_bias_dtypes(fp8kit_dtype d) {
  switch (d) {
    case FP8KIT_FLOAT16: return "float16";
    case FP8KIT_E4M3:
    case FP8KIT_E5M2: return "bfloat16 or float16";
    default: return "bfloat16";
  }
}

}  // namespace

GemmProblem make_gemm_problem(const fp8kit_tensor* a, const fp8kit_tensor* b,
                              const fp8kit_tensor* d, const fp8kit_gemm_config* config) {
  check_not_null(kOp, "config", config);
  check_tensor(kOp, "A", a, /*allow_null_data=*/true);
  check_tensor(kOp, "B", b, /*allow_null_data=*/true);
  check_tensor(kOp, "D", d);
  check_same_device(kOp, "A", *a, "B", *b);
  check_same_device(kOp, "A", *a, "D", *d);

  // Operand types.
  check_operand_descriptor("A", *a);
  check_operand_descriptor("B", *b);
  FP8KIT_CHECK(!(a->dtype == FP8KIT_E5M2 && b->dtype == FP8KIT_E5M2),
               "gemm: A and B are both e5m2; cuBLASLt has no e5m2 x e5m2 FP8 GEMM. Quantize one of "
               "them as e4m3 (the hybrid recipe keeps forward tensors in e4m3)");

  // Shapes.
  FP8KIT_CHECK(config->trans_a == 0 || config->trans_a == 1, "gemm: config.trans_a is ",
               config->trans_a, "; use 0 or 1");
  FP8KIT_CHECK(config->trans_b == 0 || config->trans_b == 1, "gemm: config.trans_b is ",
               config->trans_b, "; use 0 or 1");
  int64_t ar, ac, br, bc, dr, dc;
  flatten_2d(*a, &ar, &ac);
  flatten_2d(*b, &br, &bc);
  const int64_t m = config->trans_a ? ac : ar;
  const int64_t k = config->trans_a ? ar : ac;
  const int64_t n = config->trans_b ? br : bc;
  const int64_t kb = config->trans_b ? bc : br;
  FP8KIT_CHECK(k == kb, "gemm: A has shape ", shape_string(*a), " (trans_a=", config->trans_a,
               ", so op(A) is ", m, "x", k, ") but B has shape ", shape_string(*b), " (trans_b=",
               config->trans_b, ", so op(B) is ", kb, "x", n,
               "); the inner dimensions must match: check the shapes and trans flags");
  FP8KIT_CHECK(k > 0, "gemm: K is 0 (A has shape ", shape_string(*a),
               "); FP8 GEMM needs K > 0");
  FP8KIT_CHECK(k % FP8KIT_GEMM_DIM_MULTIPLE == 0, "gemm: A has shape ", shape_string(*a),
               " (trans_a=", config->trans_a, ", so op(A) is ", m, "x", k,
               ") but FP8 GEMM needs K to be a multiple of ", FP8KIT_GEMM_DIM_MULTIPLE, " (got K = ",
               k, "); pad the inner dimension with zeros");

  // D.
  const bool d_fp8 = is_fp8(d->dtype);
  FP8KIT_CHECK(d_fp8 || is_high_precision(d->dtype), "gemm: D has dtype ",
               fp8kit_dtype_name(d->dtype), "; use bfloat16, float16, float32, e4m3 or e5m2");
  FP8KIT_CHECK(d->rank >= 1, "gemm: D has rank 0; D must be [M, N] (M = ", m, ", N = ", n, ")");
  flatten_2d(*d, &dr, &dc);
  FP8KIT_CHECK(dr == m && dc == n, "gemm: D has shape ", shape_string(*d), " but op(A) @ op(B) is ",
               m, "x", n, "; D must be [M, N] (leading dimensions may be split)");
  const int64_t d_row_bytes = n * int64_t(fp8kit_dtype_size(d->dtype));
  constexpr int64_t row_bytes = FP8KIT_GEMM_ROW_BYTES_MULTIPLE;
  FP8KIT_CHECK(d_row_bytes % row_bytes == 0, "gemm: D is ", m, "x", n, " ",
               fp8kit_dtype_name(d->dtype), " but FP8 GEMM needs each row of D to be a multiple of ",
               row_bytes, " bytes (N a multiple of ", row_bytes / fp8kit_dtype_size(d->dtype),
               " for ", fp8kit_dtype_name(d->dtype), "); pad N (the output features)");
  if (d_fp8) {
    FP8KIT_CHECK(d->dtype == FP8KIT_E4M3 || a->dtype == FP8KIT_E5M2 || b->dtype == FP8KIT_E5M2,
                 "gemm: D is e5m2 but A and B are both e4m3; cuBLASLt writes e5m2 only from mixed "
                 "e4m3 x e5m2 inputs. Use an e4m3 (or bf16) output");
    FP8KIT_CHECK(d->scaling_mode == FP8KIT_SCALING_PER_TENSOR, "gemm: D is ",
                 fp8kit_dtype_name(d->dtype),
                 " so it needs per-tensor scaling (FP8KIT_SCALING_PER_TENSOR) with a scale");
    FP8KIT_CHECK(d->scale != nullptr, "gemm: D is ", fp8kit_dtype_name(d->dtype),
                 " but has no scale; an FP8 output is quantized with D's scale (q = D * scale)");
    FP8KIT_CHECK(config->beta == 0.0f, "gemm: config.beta is ", config->beta, " but D is ",
                 fp8kit_dtype_name(d->dtype),
                 "; accumulating into D (beta != 0) needs a bfloat16, float16 or float32 D");
  }
  if (m > 0 && n > 0) check_aligned16("D's data", d->data);

  // Epilogue, bias, GELU auxiliary output.
  const fp8kit_epilogue ep = config->epilogue;
  FP8KIT_CHECK(ep == FP8KIT_EPILOGUE_DEFAULT || ep == FP8KIT_EPILOGUE_BIAS ||
                   ep == FP8KIT_EPILOGUE_GELU || ep == FP8KIT_EPILOGUE_GELU_BIAS,
               "gemm: config.epilogue is ", int(ep), "; use one of FP8KIT_EPILOGUE_*");
  if (epilogue_has_bias(ep)) {
    FP8KIT_CHECK(config->bias != nullptr, "gemm: the epilogue adds a bias but config.bias is NULL");
    FP8KIT_CHECK(bias_dtype_ok(d->dtype, config->bias_dtype), "gemm: bias has dtype ",
                 fp8kit_dtype_name(config->bias_dtype), " but with a ", fp8kit_dtype_name(d->dtype),
                 " D cuBLASLt takes a ", allowed_bias_dtypes(d->dtype), " bias; cast the bias");
    FP8KIT_CHECK(config->bias_numel <= 0 || config->bias_numel == n, "gemm: bias has ",
                 config->bias_numel, " elements but D has N = ", n, " columns; bias must be [N]");
    check_aligned16("bias", config->bias);
  } else {
    FP8KIT_CHECK(config->bias == nullptr, "gemm: config.bias is set but the epilogue (",
                 int(ep), ") adds no bias; use FP8KIT_EPILOGUE_BIAS or FP8KIT_EPILOGUE_GELU_BIAS");
  }
  if (config->gelu_aux != nullptr) {
    FP8KIT_CHECK(epilogue_has_gelu(ep), "gemm: config.gelu_aux is set but the epilogue (", int(ep),
                 ") has no GELU; use FP8KIT_EPILOGUE_GELU or FP8KIT_EPILOGUE_GELU_BIAS");
    FP8KIT_CHECK(d->dtype == FP8KIT_BFLOAT16 || d->dtype == FP8KIT_FLOAT16,
                 "gemm: config.gelu_aux (the pre-GELU output, stored in D's dtype) needs a bfloat16 "
                 "or float16 D, but D is ", fp8kit_dtype_name(d->dtype));
    FP8KIT_CHECK(config->gelu_aux_numel <= 0 || config->gelu_aux_numel == m * n,
                 "gemm: gelu_aux has ", config->gelu_aux_numel, " elements but D is ", m, "x", n,
                 "; gelu_aux must be [M, N]");
    check_aligned16("gelu_aux", config->gelu_aux);
  }

  // Workspace (cuBLASLt only).
  if (d->device_type == FP8KIT_DEVICE_CUDA) {
    FP8KIT_CHECK(config->workspace != nullptr || config->workspace_bytes == 0,
                 "gemm: config.workspace_bytes is ", config->workspace_bytes,
                 " but config.workspace is NULL; pass both, or NULL and 0 for fp8kit's own workspace");
    FP8KIT_CHECK(config->workspace == nullptr || config->workspace_bytes > 0,
                 "gemm: config.workspace is set but config.workspace_bytes is 0");
    FP8KIT_CHECK(aligned(config->workspace, 256), "gemm: config.workspace pointer ", config->workspace,
                 " is not 256-byte aligned, which cuBLASLt requires");
  }

  // Block scaling's own rules; its kernels read both operands K-contiguous.
  const bool block = gemm_is_block_scaled(*a, *b);
  if (block) check_block_scaled_gemm(*a, *b, *d, *config, m, n);

  // TN canonicalization: pick the data each operand is read from.
  const bool non_tn = !block && device_runs_non_tn(d->device_type, d->device_index);
  GemmProblem p;
  p.device_type = d->device_type;
  p.device_index = d->device_type == FP8KIT_DEVICE_CUDA ? d->device_index : 0;
  p.m = m;
  p.n = n;
  p.k = k;
  p.a = pick_operand("A", "trans_a", config->trans_a, *a, /*rowwise_k_major=*/config->trans_a == 0,
                     non_tn, m, k, "M");
  p.b = pick_operand("B", "trans_b", config->trans_b, *b, /*rowwise_k_major=*/config->trans_b == 1,
                     non_tn, n, k, "N");
  p.d = d->data;
  p.d_dtype = d->dtype;
  if (d_fp8) {
    check_scalar_aligned16("D", "scale", d->scale);
    if (d->amax != nullptr) check_scalar_aligned16("D", "amax", d->amax);
  }
  p.d_scale = d_fp8 ? d->scale : nullptr;
  p.d_amax = d_fp8 ? d->amax : nullptr;
  p.d_scale_inv = d_fp8 ? d->scale_inv : nullptr;
  p.alpha = config->alpha;
  p.beta = config->beta;
  p.epilogue = ep;
  p.bias = epilogue_has_bias(ep) ? config->bias : nullptr;
  p.bias_dtype = epilogue_has_bias(ep) ? config->bias_dtype : FP8KIT_BFLOAT16;
  p.gelu_aux = config->gelu_aux;
  p.fast_accumulation = config->use_split_accumulator == 0;
  p.workspace = config->workspace;
  p.workspace_bytes = config->workspace_bytes;
  return p;
}

}  // namespace fp8kit
