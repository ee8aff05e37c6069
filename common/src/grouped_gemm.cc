// fp8kit_grouped_gemm: one fp8kit GEMM per group, each validated and run as
// fp8kit_gemm runs a single one (gemm_problem.h), so the CPU reference and
// cuBLASLt see the same per-group problems.
#include <cstring>
#include <vector>

#include "error.h"
#include "fp8kit/grouped.h"
#include "gemm_cpu.h"
#include "gemm_problem.h"
#include "grouped_layout.h"
#include "validate.h"
#ifdef FP8KIT_WITH_CUDA
#include "cuda_backend.h"
#endif

namespace fp8kit {
namespace {

constexpr const char* kOp = "grouped_gemm";

char* offset(const void* p, int64_t elements, fp8kit_dtype dtype) {
  return p == nullptr ? nullptr
                      : static_cast<char*>(const_cast<void*>(p)) +
                            elements * static_cast<int64_t>(fp8kit_dtype_size(dtype));
}

float* group_scale(const float* scales, int64_t g) {
  return scales == nullptr ? nullptr
                           : const_cast<float*>(scales) + g * FP8KIT_GROUP_SCALE_STRIDE;
}

bool is_block(const fp8kit_tensor& t) {
  return t.scaling_mode == FP8KIT_SCALING_BLOCK_1X128 ||
         t.scaling_mode == FP8KIT_SCALING_BLOCK_128X128;
}

// Where each group's rows are: the contiguous layout's starts for
// per-tensor operands, the padded row layout's (fp8kit/grouped.h) for
// block-scaled ones, with p_g rows each.
struct Rows {
  const std::vector<int64_t>& first;
  bool padded;
  const GroupLayout& layout;
  int64_t count(int64_t g) const { return padded ? layout.padded(g) : layout.sizes[g]; }
};

Rows rows_of(const GroupLayout& layout, bool block) {
  return Rows{block ? layout.column_starts : layout.starts, block, layout};
}

// `floats` into a scale array (a group's block scales), NULL for NULL.
float* floats_at(const float* scales, int64_t floats) {
  return scales == nullptr ? nullptr : const_cast<float*>(scales) + floats;
}

fp8kit_tensor matrix(const fp8kit_tensor& like, int64_t rows, int64_t cols) {
  fp8kit_tensor t = like;
  t.rank = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  t.data = nullptr;
  t.columnwise_data = nullptr;
  t.scale = nullptr;
  t.amax = nullptr;
  t.block_scale_inv = nullptr;
  t.columnwise_block_scale_inv = nullptr;
  return t;
}

void check_rank(const char* arg, const fp8kit_tensor* t, int rank, const char* expected) {
  check_tensor(kOp, arg, t, /*allow_null_data=*/true);
  FP8KIT_CHECK(t->rank == rank, kOp, ": ", arg, " has shape ", shape_string(*t),
               "; it must be ", expected);
}

// The per-group problems of one call; groups with no tokens get none.
struct GroupProblems {
  std::vector<GemmProblem> problems;
  std::vector<std::pair<void*, size_t>> zeroed;  // D blocks to zero (bytes)
};

GroupProblems tokens_problems(const fp8kit_tensor& a, const fp8kit_tensor& b,
                              const fp8kit_tensor& d, const GroupLayout& layout,
                              const fp8kit_grouped_gemm_config& config) {
  check_rank("b", &b, 3, "[E, R, C], one matrix per group");
  FP8KIT_CHECK(b.shape[0] == layout.groups(), kOp, ": b holds ", b.shape[0],
               " matrices but group_sizes has ", layout.groups(), " groups");
  check_rank("d", &d, 2, "[tokens, N]");
  FP8KIT_CHECK(d.shape[0] == a.shape[0], kOp, ": d has ", d.shape[0], " rows but a has ",
               a.shape[0], "; d holds one output row per row of a");
  const int64_t k = a.shape[1], rows = b.shape[1], cols = b.shape[2];
  const bool block = is_block(a);
  const Rows a_rows = rows_of(layout, block);
  std::vector<int64_t> a_scales;
  int64_t b_row_scales = 0, b_col_scales = 0;
  if (block) {
    a_scales = block_scale_offsets(layout, k, a.scaling_mode, false);
    if (is_block(b)) {
      b_row_scales = block_scales_floats(rows, cols, b.scaling_mode, false);
      b_col_scales = block_scales_floats(rows, cols, b.scaling_mode, true);
    }
  }
  fp8kit_gemm_config gemm = fp8kit_gemm_config_default();
  gemm.trans_b = config.trans_b;
  gemm.use_split_accumulator = config.use_split_accumulator;
  const int64_t n = config.trans_b ? rows : cols;
  if (config.bias != nullptr) {
    gemm.epilogue = FP8KIT_EPILOGUE_BIAS;
    gemm.bias_dtype = config.bias_dtype;
    gemm.bias_numel = n;
  }
  GroupProblems out;
  if (block) {  // the rows after the last group: defined, though no group writes them
    const int64_t used = layout.column_starts[layout.groups()];
    out.zeroed.emplace_back(offset(d.data, used * d.shape[1], d.dtype),
                            size_t((d.shape[0] - used) * d.shape[1]) * fp8kit_dtype_size(d.dtype));
  }
  for (int64_t g = 0; g < layout.groups(); ++g) {
    const int64_t m = a_rows.count(g), start = a_rows.first[g];
    fp8kit_tensor a_g = matrix(a, m, k);
    a_g.data = offset(a.data, start * k, a.dtype);
    a_g.scale_inv = group_scale(a.scale_inv, g);
    if (block) a_g.block_scale_inv = floats_at(a.block_scale_inv, a_scales[g]);
    fp8kit_tensor b_g = matrix(b, rows, cols);
    b_g.data = offset(b.data, g * rows * cols, b.dtype);
    b_g.columnwise_data = offset(b.columnwise_data, g * rows * cols, b.dtype);
    b_g.scale_inv = group_scale(b.scale_inv, g);
    if (is_block(b)) {
      b_g.block_scale_inv = floats_at(b.block_scale_inv, g * b_row_scales);
      b_g.columnwise_block_scale_inv = floats_at(b.columnwise_block_scale_inv, g * b_col_scales);
    }
    fp8kit_tensor d_g = matrix(d, m, d.shape[1]);
    d_g.data = offset(d.data, start * d.shape[1], d.dtype);
    gemm.bias = offset(config.bias, g * n, config.bias_dtype);
    GemmProblem p = make_gemm_problem(&a_g, &b_g, &d_g, &gemm);
    p.autotune = false;
    if (m > 0) out.problems.push_back(p);
  }
  return out;
}

GroupProblems contract_problems(const fp8kit_tensor& a, const fp8kit_tensor& b,
                                const fp8kit_tensor& d, const GroupLayout& layout,
                                const fp8kit_grouped_gemm_config& config) {
  check_rank("b", &b, 2, "[tokens, N], token-grouped");
  FP8KIT_CHECK(b.shape[0] == a.shape[0], kOp, ": a has ", a.shape[0], " rows but b has ",
               b.shape[0], "; both are token-grouped by the same group_sizes");
  check_rank("d", &d, 3, "[E, M, N], one matrix per group");
  FP8KIT_CHECK(config.bias == nullptr, kOp, ": config.bias is set, but the token-contracting "
               "GEMM takes no bias (its bias gradient is the sum of dy over the tokens)");
  const int64_t m = a.shape[1], n = b.shape[1];
  fp8kit_gemm_config gemm = fp8kit_gemm_config_default();
  gemm.trans_a = 1;
  gemm.use_split_accumulator = config.use_split_accumulator;
  const bool block = is_block(a);
  std::vector<int64_t> a_scales, b_scales;
  if (block) {
    a_scales = block_scale_offsets(layout, m, a.scaling_mode, true);
    if (is_block(b)) b_scales = block_scale_offsets(layout, n, b.scaling_mode, true);
  }
  GroupProblems out;
  for (int64_t g = 0; g < layout.groups(); ++g) {
    const int64_t padded = layout.padded(g), column = layout.column_starts[g];
    void* d_data = offset(d.data, g * m * n, d.dtype);
    if (padded == 0) {
      out.zeroed.emplace_back(d_data, size_t(m * n) * fp8kit_dtype_size(d.dtype));
      continue;
    }
    fp8kit_tensor a_g = matrix(a, padded, m);
    a_g.columnwise_data = offset(a.columnwise_data, column * m, a.dtype);
    a_g.scale_inv = group_scale(a.scale_inv, g);
    fp8kit_tensor b_g = matrix(b, padded, n);
    b_g.columnwise_data = offset(b.columnwise_data, column * n, b.dtype);
    b_g.scale_inv = group_scale(b.scale_inv, g);
    if (block) {
      a_g.columnwise_block_scale_inv = floats_at(a.columnwise_block_scale_inv, a_scales[g]);
      if (is_block(b)) {
        b_g.columnwise_block_scale_inv = floats_at(b.columnwise_block_scale_inv, b_scales[g]);
      }
    }
    fp8kit_tensor d_g = matrix(d, m, n);
    d_g.data = d_data;
    GemmProblem p = make_gemm_problem(&a_g, &b_g, &d_g, &gemm);
    p.autotune = false;
    out.problems.push_back(p);
  }
  return out;
}

}  // namespace
}  // namespace fp8kit

extern "C" fp8kit_status fp8kit_grouped_gemm(fp8kit_grouped_gemm_kind kind,
                                             const fp8kit_tensor* a, const fp8kit_tensor* b,
                                             fp8kit_tensor* d, const fp8kit_tensor* group_sizes,
                                             const fp8kit_grouped_gemm_config* config,
                                             void* stream) {
  using namespace fp8kit;
  return guard([&] {
    FP8KIT_CHECK(config != nullptr, kOp, ": config is NULL; pass a fp8kit_grouped_gemm_config");
    FP8KIT_CHECK(kind == FP8KIT_GROUPED_GEMM_TOKENS || kind == FP8KIT_GROUPED_GEMM_CONTRACT_TOKENS,
                 kOp, ": kind is ", int(kind), "; use FP8KIT_GROUPED_GEMM_TOKENS or "
                 "FP8KIT_GROUPED_GEMM_CONTRACT_TOKENS");
    check_rank("a", a, 2, "[tokens, features], token-grouped");
    check_tensor(kOp, "d", d, /*allow_null_data=*/true);
    check_same_device(kOp, "a", *a, "d", *d);
    const GroupLayout layout = read_group_layout(kOp, group_sizes, a->shape[0], d->device_type,
                                                 d->device_index, stream, is_block(*a));
    const GroupProblems groups = kind == FP8KIT_GROUPED_GEMM_TOKENS
                                     ? tokens_problems(*a, *b, *d, layout, *config)
                                     : contract_problems(*a, *b, *d, layout, *config);
    for (const auto& [data, bytes] : groups.zeroed) {
      if (d->device_type == FP8KIT_DEVICE_CPU) {
        std::memset(data, 0, bytes);
      } else {
#ifdef FP8KIT_WITH_CUDA
        cuda::zero_bytes(d->device_index, data, bytes, stream);
#endif
      }
    }
    for (const GemmProblem& p : groups.problems) {
      if (p.device_type == FP8KIT_DEVICE_CPU) {
        gemm_cpu(p);
      } else {
#ifdef FP8KIT_WITH_CUDA
        cuda::gemm(p, stream);
#endif
      }
    }
    (void)stream;
  });
}
