// fp8kit::cuda::quantize_delayed_update: delayed-scaling quantization of
// several tensors in one launch, each followed by its delayed-scaling
// update, with no zeroing or update launches of its own.
//
// Why: a small layer's step is bound by launches, not bandwidth (ANCHORS.md
// P4). The one-tensor path costs three launches per tensor (zero amax,
// cast, update); here a Linear forward quantizes its input and weight in
// one.
//
// How, per tensor ("job") of a group:
//   - its blocks cast as the one-tensor kernels do (cast_transpose_block /
//     cast_flat_block) and atomicMax their amax into the state's amax
//     accumulator, which holds 0 (or an amax to fold in) on entry;
//   - each block then counts itself done in the job's counter; the block
//     that finishes last (threadfence-reduction pattern) sees every
//     block's amax, rolls the history, writes the new scale and scale_inv
//     and resets the accumulator and the counter to 0 for the next call.
//   - with column sums (fp8kit_column_sums, cast+transpose jobs only), each
//     block also writes its tile's column sums to the job's partials, and
//     the last row tile of each column tile adds them up (finish_column_sums).
// Every block has read the old scale before it counts itself done, so the
// last block can overwrite it. A group holds jobs that use the same kernel
// (kind, input dtype, FP8 dtype, column sums or not), up to kMaxGroup; a
// call makes one launch per group.
#include <cuda_runtime.h>

#include <cstdint>

#include "cast_jobs.cuh"
#include "column_sums.h"
#include "compute_scale.h"
#include "cuda_backend.h"
#include "cuda_check.h"
#include "delayed_update_device.cuh"
#include "launch_config.h"

namespace fp8kit {
namespace cuda {
namespace {

constexpr int kMaxGroup = 4;     // jobs per launch
constexpr int kMaxMembers = 64;  // tensors per call (the C API checks)

// One job's state (fp8kit_delayed_quantize_state) and its FP8 maximum.
struct FusedState {
  float* history;
  float* amax;
  float* scale;
  float* scale_inv;
  unsigned int* counter;
  float fp8_max;
};

// One job's column sums (fp8kit_column_sums), for the cast+transpose kind.
struct SumsJob {
  void* out;
  fp8kit_dtype dtype;
  float* partials;         // [tiles_r, cols]
  unsigned int* counters;  // [tiles_c]
  int64_t tiles_r;
};

struct UpdateConfig {
  int history_len;
  int margin;
  int most_recent;
};

template <typename CastParams>
struct GroupParams {
  CastParams job[kMaxGroup];
  FusedState state[kMaxGroup];
  SumsJob sums[kMaxGroup];  // used by the kSums kernels only
  int64_t first_block[kMaxGroup + 1];  // job j owns blocks [first_block[j], first_block[j+1])
  int count;
  UpdateConfig config;
};

// Called by every thread of a block after the block's cast (whose thread 0
// made the amax atomic). The job's last block runs the update.
__device__ __forceinline__ void finish_job(const FusedState& s, const UpdateConfig& c,
                                           unsigned int job_blocks) {
  __shared__ bool last;
  __shared__ float newest;
  if (threadIdx.x == 0) {
    __threadfence();  // this block's amax atomic is visible before it counts
    last = atomicAdd(s.counter, 1u) == job_blocks - 1;
    if (last) {
      __threadfence();
      newest = __uint_as_float(atomicOr(reinterpret_cast<unsigned int*>(s.amax), 0u));
    }
  }
  __syncthreads();
  if (!last) return;
  const float r = roll_history_and_reduce(s.history, c.history_len, newest, c.most_recent != 0);
  if (threadIdx.x == 0) {
    const float scale = delayed_scale_from_amax(r, *s.scale, s.fp8_max, c.margin);
    *s.scale = scale;
    *s.scale_inv = reciprocal(scale);
    *s.amax = 0.0f;
    *s.counter = 0u;
  }
}

template <typename CastParams>
__device__ __forceinline__ int job_of_block(const GroupParams<CastParams>& g) {
  int j = 0;
  while (j + 1 < g.count && int64_t(blockIdx.x) >= g.first_block[j + 1]) ++j;
  return j;
}

// After cast_transpose_block<..., kSums = true> on tile `tile`: the tile's
// column sums (its 16 group sums added in order) go to the partials; the
// block that finishes a column tile last (threadfence + counter, as in
// finish_job) adds the partials of every row tile in order and writes the
// column sums, then resets the counter. The order is fp8kit_column_sums's.
__device__ __forceinline__ void finish_column_sums(const SumsJob& s, const CastTransposeParams& p,
                                                   int64_t tile, const GroupSums& group_sums) {
  __shared__ bool last;
  const int64_t tile_r = tile / p.tiles_c;
  const int64_t tile_c = tile % p.tiles_c;
  const int64_t col = tile_c * kCtTile + threadIdx.x;
  const bool owns_col = threadIdx.x < kCtTile && col < p.cols;
  if (owns_col) {
    float sum = 0.0f;
#pragma unroll
    for (int grp = 0; grp < kCtTile / 8; ++grp) {
      sum = add_rn(sum, group_sums[grp][group_sum_slot(grp, threadIdx.x)]);
    }
    s.partials[tile_r * p.cols + col] = sum;
    __threadfence();  // the partial is visible before the tile counts itself done
  }
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&s.counters[tile_c], 1u) == unsigned(s.tiles_r - 1);
  __syncthreads();
  if (!last) return;
  if (owns_col) {
    // The adds are in tile order; the loads (from L2, not a stale L1) are
    // issued kChunk at a time, so the last blocks of the grid wait for
    // tiles_r / kChunk L2 round trips, not tiles_r.
    constexpr int kChunk = 16;
    const float* partial = s.partials + col;
    float total = 0.0f;
    int64_t r = 0;
    for (; r + kChunk <= s.tiles_r; r += kChunk) {
      float v[kChunk];
#pragma unroll
      for (int i = 0; i < kChunk; ++i) v[i] = __ldcg(partial + (r + i) * p.cols);
#pragma unroll
      for (int i = 0; i < kChunk; ++i) total = add_rn(total, v[i]);
    }
    for (; r < s.tiles_r; ++r) total = add_rn(total, __ldcg(partial + r * p.cols));
    store_column_sum(s.out, s.dtype, col, total);
  }
  if (threadIdx.x == 0) s.counters[tile_c] = 0u;
}

template <int kIn, bool kE4M3, bool kRowwise, bool kSums>
__global__ void __launch_bounds__(kCtThreads, kIn == FP8KIT_FLOAT32 ? 2 : 4)
    grouped_cast_transpose_kernel(const __grid_constant__ GroupParams<CastTransposeParams> g) {
  const int j = job_of_block(g);
  const CastTransposeParams& p = g.job[j];
  const int64_t block = int64_t(blockIdx.x) - g.first_block[j];
  if constexpr (kSums) {  // the host checked rows > 1 and cols > 1
    __shared__ GroupSums group_sums;
    cast_transpose_block<kIn, kE4M3, kRowwise, true>(p, block, &group_sums);
    finish_column_sums(g.sums[j], p, block, group_sums);
  } else if (p.rows * p.cols > 0) {
    cast_transpose_block<kIn, kE4M3, kRowwise>(p, block);
  } else if (threadIdx.x == 0) {
    (void)read_scale(p.scale, true);  // an empty tensor still gets its scale_inv
  }
  finish_job(g.state[j], g.config, unsigned(g.first_block[j + 1] - g.first_block[j]));
}

template <int kIn, bool kE4M3>
__global__ void __launch_bounds__(kFlatThreads)
    grouped_cast_flat_kernel(const __grid_constant__ GroupParams<CastFlatParams> g) {
  const int j = job_of_block(g);
  const CastFlatParams& p = g.job[j];
  const int64_t block = int64_t(blockIdx.x) - g.first_block[j];
  if (p.n > 0) {
    cast_flat_block<kIn, kE4M3>(p, block);
  } else if (threadIdx.x == 0) {
    (void)read_scale(p.scale, true);
  }
  finish_job(g.state[j], g.config, unsigned(g.first_block[j + 1] - g.first_block[j]));
}

// One tensor of the call, as the kernels see it.
struct Member {
  CastJob job;
  FusedState state;
  const fp8kit_column_sums* sums;  // NULL: none
  CastKind kind;
  fp8kit_dtype in_dtype, fp8_dtype;
};

// Up to kMaxGroup members launched together.
struct Group {
  const Member* member[kMaxGroup];
  int count;
};

template <typename CastParams, typename MakeParams, typename Blocks>
GroupParams<CastParams> group_params(const Group& group, const UpdateConfig& config,
                                     MakeParams make, Blocks blocks) {
  GroupParams<CastParams> g{};
  g.count = group.count;
  g.config = config;
  g.first_block[0] = 0;
  for (int j = 0; j < g.count; ++j) {
    g.job[j] = make(group.member[j]->job);
    g.state[j] = group.member[j]->state;
    const int64_t b = blocks(g.job[j]);
    g.first_block[j + 1] = g.first_block[j] + (b > 0 ? b : 1);  // an empty job: one block
  }
  return g;
}

template <int kIn, bool kE4M3>
void launch_group_typed(const Group& group, const UpdateConfig& config,
                        cudaStream_t stream, const char* op) {
  const CastKind kind = group.member[0]->kind;
  if (kind == CastKind::kFlat) {
    const auto g = group_params<CastFlatParams>(group, config, flat_params, flat_blocks);
    grouped_cast_flat_kernel<kIn, kE4M3>
        <<<unsigned(g.first_block[g.count]), kFlatThreads, 0, stream>>>(g);
  } else {
    auto g = group_params<CastTransposeParams>(group, config, transpose_params, transpose_blocks);
    const bool sums = group.member[0]->sums != nullptr;
    for (int j = 0; sums && j < g.count; ++j) {
      const fp8kit_column_sums& cs = *group.member[j]->sums;
      g.sums[j] = SumsJob{cs.sums, cs.dtype, cs.partials, cs.counters,
                          ceil_div(g.job[j].rows, kCtTile)};
    }
    const unsigned blocks = unsigned(g.first_block[g.count]);
    const bool rowwise = kind == CastKind::kTransposeWithRowwise;
    if (rowwise && sums) {
      grouped_cast_transpose_kernel<kIn, kE4M3, true, true><<<blocks, kCtThreads, 0, stream>>>(g);
    } else if (rowwise) {
      grouped_cast_transpose_kernel<kIn, kE4M3, true, false><<<blocks, kCtThreads, 0, stream>>>(g);
    } else if (sums) {
      grouped_cast_transpose_kernel<kIn, kE4M3, false, true><<<blocks, kCtThreads, 0, stream>>>(g);
    } else {
      grouped_cast_transpose_kernel<kIn, kE4M3, false, false><<<blocks, kCtThreads, 0, stream>>>(g);
    }
  }
  check_launch(op, "launching the fused quantize+update kernel");
}

template <int kIn>
void launch_group_in(const Group& group, const UpdateConfig& config,
                     cudaStream_t stream, const char* op) {
  if (group.member[0]->fp8_dtype == FP8KIT_E4M3) {
    launch_group_typed<kIn, true>(group, config, stream, op);
  } else {
    launch_group_typed<kIn, false>(group, config, stream, op);
  }
}

void launch_group(const Group& group, const UpdateConfig& config,
                  cudaStream_t stream, const char* op) {
  switch (group.member[0]->in_dtype) {
    case FP8KIT_FLOAT32: launch_group_in<FP8KIT_FLOAT32>(group, config, stream, op); break;
    case FP8KIT_BFLOAT16: launch_group_in<FP8KIT_BFLOAT16>(group, config, stream, op); break;
    default: launch_group_in<FP8KIT_FLOAT16>(group, config, stream, op); break;
  }
}

bool same_kernel(const Member& a, const Member& b) {
  return a.kind == b.kind && a.in_dtype == b.in_dtype && a.fp8_dtype == b.fp8_dtype &&
         (a.sums != nullptr) == (b.sums != nullptr);
}

}  // namespace

void quantize_delayed_update(const fp8kit_tensor* inputs, fp8kit_tensor* outputs,
                             const fp8kit_delayed_quantize_state* states,
                             const fp8kit_column_sums* sums, int count,
                             const fp8kit_delayed_scaling_config& config, void* stream_ptr) {
  const char* op = "quantize_delayed_update";
  ScopedDevice device(inputs[0].device_index, op);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  Member members[kMaxMembers];
  for (int i = 0; i < count; ++i) {
    const fp8kit_delayed_quantize_state& s = states[i];
    Member& m = members[i];
    m.job = make_job(inputs[i], outputs[i]);
    m.job.amax = s.amax;
    m.job.scale = ScaleSource{s.scale, nullptr, fp8kit_fp8_max(outputs[i].dtype), 0.0f, 0,
                              nullptr, outputs[i].scale_inv};
    m.state = FusedState{s.amax_history, s.amax, s.scale, s.scale_inv, s.counter,
                         fp8kit_fp8_max(outputs[i].dtype)};
    m.sums = sums != nullptr && sums[i].sums != nullptr ? &sums[i] : nullptr;
    m.kind = cast_kind(m.job);
    m.in_dtype = inputs[i].dtype;
    m.fp8_dtype = outputs[i].dtype;
  }
  const UpdateConfig update{config.history_len, config.margin,
                            config.reduction == FP8KIT_AMAX_MOST_RECENT ? 1 : 0};
  // Greedy grouping in call order: each launch takes the first unplaced
  // member and every later one with the same kernel, up to kMaxGroup.
  bool placed[kMaxMembers] = {};
  for (int i = 0; i < count; ++i) {
    if (placed[i]) continue;
    Group group{{&members[i]}, 1};
    placed[i] = true;
    for (int k = i + 1; k < count && group.count < kMaxGroup; ++k) {
      if (!placed[k] && same_kernel(members[i], members[k])) {
        group.member[group.count++] = &members[k];
        placed[k] = true;
      }
    }
    launch_group(group, update, stream, op);
  }
}

}  // namespace cuda
}  // namespace fp8kit
