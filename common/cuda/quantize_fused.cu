// fp8kit::cuda::quantize_delayed_update: delayed-scaling quantization of
// several tensors in one launch, each followed by its delayed-scaling
// update, with no zeroing or update launches of its own; and
// quantize_current_scaling_many: current scaling of several tensors in
// three launches (zero every amax, reduce every amax, cast all).
//
// Why: a small layer's step is bound by launches, not bandwidth. The
// one-tensor paths cost three launches per tensor (delayed: zero amax,
// cast, update; current: zero amax, amax, cast); here a Linear forward
// quantizes its input and weight in one (delayed) or three (current).
//
// How, per tensor ("job") of a group:
//   - its blocks cast as the one-tensor kernels do (cast_transpose_block /
//     cast_flat_block) and, when recording, atomicMax their amax into the
//     state's amax accumulator, which holds 0 (or an amax to fold in) on
//     entry;
//   - each block then counts itself done in the job's counter; the block
//     that finishes last (threadfence-reduction pattern) sees every
//     block's amax, rolls the history, writes the new scale and scale_inv,
//     marks the slot seeded (all only when recording) and resets the
//     accumulator and the counter to 0 for the next call;
//   - with column sums (fp8kit_column_sums, cast+transpose jobs only), each
//     block also writes its tile's column sums to the job's partials, and
//     the last row tile of each column tile adds them up (column_sums.cuh).
// Seeding: when any state has a `seeded` flag, a pre-pass launch first
// accumulates, for each fresh slot only (a block of a seeded one exits at
// once), the tensor's amax into the accumulator; every cast block of a
// fresh slot derives the same seed scale from it (read_scale). The cast's
// own amax atomics cannot raise it (same data), so the last block sees the
// value the seed came from.
// Every block has read the old scale, the flag and the accumulator before
// it counts itself done, so the last block can overwrite them.
// Current scaling uses the same cast kernels with no state (update_states
// 0): each block derives the scale from its tensor's finished amax, which
// launch_amax_many wrote before (read_scale). A group
// holds jobs that use the same kernel (kind, input dtype, FP8 dtype,
// column sums or not), up to kMaxGroup; a call makes one launch per group.
#include <cuda_runtime.h>

#include <cstdint>

#include "cast_jobs.cuh"
#include "column_sums.cuh"
#include "compute_scale.h"
#include "cuda_backend.h"
#include "cuda_check.h"
#include "delayed_update_device.cuh"
#include "fused_update_device.cuh"
#include "launch_config.h"
#include "pdl.cuh"
#include "quantize_device.cuh"
#include "quantize_launch.h"

namespace fp8kit {
namespace cuda {
namespace {

constexpr int kMaxGroup = 4;     // jobs per launch
constexpr int kMaxMembers = 64;  // tensors per call (the C API checks)

template <typename CastParams>
struct GroupParams {
  CastParams job[kMaxGroup];
  FusedState state[kMaxGroup];
  SumsJob sums[kMaxGroup];  // used by the kSums kernels only
  int64_t first_block[kMaxGroup + 1];  // job j owns blocks [first_block[j], first_block[j+1])
  int count;
  int update_states;  // 1: delayed scaling (finish_job); 0: current scaling, no state
  UpdateConfig config;
};

template <typename CastParams>
__device__ __forceinline__ int job_of_block(const GroupParams<CastParams>& g) {
  int j = 0;
  while (j + 1 < g.count && int64_t(blockIdx.x) >= g.first_block[j + 1]) ++j;
  return j;
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
  if (g.update_states) {
    finish_job(g.state[j], g.config, unsigned(g.first_block[j + 1] - g.first_block[j]));
  }
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
  if (g.update_states) {
    finish_job(g.state[j], g.config, unsigned(g.first_block[j + 1] - g.first_block[j]));
  }
}

// One tensor of the call, as the kernels see it.
struct Member {
  CastJob job;
  FusedState state;
  const fp8kit_column_sums* sums;  // NULL: none
  CastKind kind;
  fp8kit_dtype in_dtype, fp8_dtype;
};

// Tensor i of a call with its kernel choice and column sums (entry i of
// `sums`, if any); its job's amax and scale, and its state, are the
// caller's to set.
Member member_of(const fp8kit_tensor* inputs, const fp8kit_tensor* outputs,
                 const fp8kit_column_sums* sums, int i) {
  Member m{};
  m.job = make_job(inputs[i], outputs[i]);
  m.sums = sums != nullptr && sums[i].sums != nullptr ? &sums[i] : nullptr;
  m.kind = cast_kind(m.job);
  m.in_dtype = inputs[i].dtype;
  m.fp8_dtype = outputs[i].dtype;
  return m;
}

// Up to kMaxGroup members launched together.
struct Group {
  const Member* member[kMaxGroup];
  int count;
};

// How a group is launched: with the delayed-scaling update (update, the
// members' states) or without (current scaling), and as the programmatic
// dependent of the launch before it (pdl: that launch is the amax pass).
struct GroupLaunch {
  bool update_states;
  UpdateConfig update;
  bool pdl;
};

template <typename CastParams, typename MakeParams, typename Blocks>
GroupParams<CastParams> group_params(const Group& group, const GroupLaunch& how,
                                     MakeParams make, Blocks blocks) {
  GroupParams<CastParams> g{};
  g.count = group.count;
  g.update_states = how.update_states ? 1 : 0;
  g.config = how.update;
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
void launch_group_typed(const Group& group, const GroupLaunch& how, cudaStream_t stream,
                        const char* op) {
  constexpr const char* kWhat = "launching the grouped cast kernel";
  const CastKind kind = group.member[0]->kind;
  if (kind == CastKind::kFlat) {
    const auto g = group_params<CastFlatParams>(group, how, flat_params, flat_blocks);
    launch_pdl_or_plain(grouped_cast_flat_kernel<kIn, kE4M3>, g.first_block[g.count],
                        kFlatThreads, g, how.pdl, stream, op, kWhat);
    return;
  }
  auto g = group_params<CastTransposeParams>(group, how, transpose_params, transpose_blocks);
  const bool sums = group.member[0]->sums != nullptr;
  for (int j = 0; sums && j < g.count; ++j) {
    g.sums[j] = sums_job(*group.member[j]->sums, g.job[j].rows);
  }
  const bool rowwise = kind == CastKind::kTransposeWithRowwise;
  auto kernel = rowwise ? (sums ? grouped_cast_transpose_kernel<kIn, kE4M3, true, true>
                                : grouped_cast_transpose_kernel<kIn, kE4M3, true, false>)
                        : (sums ? grouped_cast_transpose_kernel<kIn, kE4M3, false, true>
                                : grouped_cast_transpose_kernel<kIn, kE4M3, false, false>);
  launch_pdl_or_plain(kernel, g.first_block[g.count], kCtThreads, g, how.pdl, stream, op, kWhat);
}

template <int kIn>
void launch_group_in(const Group& group, const GroupLaunch& how, cudaStream_t stream,
                     const char* op) {
  if (group.member[0]->fp8_dtype == FP8KIT_E4M3) {
    launch_group_typed<kIn, true>(group, how, stream, op);
  } else {
    launch_group_typed<kIn, false>(group, how, stream, op);
  }
}

void launch_group(const Group& group, const GroupLaunch& how, cudaStream_t stream,
                  const char* op) {
  switch (group.member[0]->in_dtype) {
    case FP8KIT_FLOAT32: launch_group_in<FP8KIT_FLOAT32>(group, how, stream, op); break;
    case FP8KIT_BFLOAT16: launch_group_in<FP8KIT_BFLOAT16>(group, how, stream, op); break;
    default: launch_group_in<FP8KIT_FLOAT16>(group, how, stream, op); break;
  }
}

bool same_kernel(const Member& a, const Member& b) {
  return a.kind == b.kind && a.in_dtype == b.in_dtype && a.fp8_dtype == b.fp8_dtype &&
         (a.sums != nullptr) == (b.sums != nullptr);
}

// ------------------------------------------------------ seeding pre-pass ----
// One tensor whose state has a `seeded` flag.
struct SeedJob {
  const void* in;
  int64_t n;
  fp8kit_dtype dtype;
  const float* seeded;
  float* amax;  // the state's accumulator
};

struct SeedParams {
  SeedJob job[kMaxMembers];
};

constexpr int kSeedThreads = 256;
constexpr int kSeedWarps = kSeedThreads / 32;

template <int kIn>
__device__ __forceinline__ uint32_t seed_amax_bits(const void* in, int64_t n) {
  uint32_t bits = 0;
  const int64_t stride = int64_t(gridDim.x) * kSeedThreads;
  for (int64_t i = int64_t(blockIdx.x) * kSeedThreads + threadIdx.x; i < n; i += stride) {
    bits = max(bits, abs_float_bits<kIn>(load_bits<kIn>(in, i)));
  }
  return bits;
}

// blockIdx.y picks the tensor. A seeded slot's blocks return at once (the
// whole block takes the same branch); a fresh slot's blocks fold the
// tensor's amax into its accumulator as the cast kernels do
// (amax_block_commit), so the accumulator ends as the CPU's
// accumulate_amax(entry, max |x|).
__global__ void __launch_bounds__(kSeedThreads) seed_amax_kernel(const __grid_constant__ SeedParams p) {
  const SeedJob& j = p.job[blockIdx.y];
  if (*j.seeded != 0.0f) return;
  __shared__ uint32_t warp_max[kSeedWarps];
  uint32_t bits;
  switch (j.dtype) {
    case FP8KIT_FLOAT32: bits = seed_amax_bits<FP8KIT_FLOAT32>(j.in, j.n); break;
    case FP8KIT_BFLOAT16: bits = seed_amax_bits<FP8KIT_BFLOAT16>(j.in, j.n); break;
    default: bits = seed_amax_bits<FP8KIT_FLOAT16>(j.in, j.n); break;
  }
  amax_block_publish(bits, warp_max);
  __syncthreads();
  amax_block_commit<kSeedWarps>(warp_max, j.amax);
}

// Launches the pre-pass over the states that have a `seeded` flag, if any.
void launch_seed_amax(const fp8kit_tensor* inputs, const fp8kit_delayed_quantize_state* states,
                      int count, cudaStream_t stream, const char* op) {
  SeedParams p{};
  int jobs = 0;
  int64_t largest = 0;
  for (int i = 0; i < count; ++i) {
    if (states[i].seeded == nullptr) continue;
    const int64_t n = fp8kit_tensor_numel(&inputs[i]);
    p.job[jobs++] = SeedJob{inputs[i].data, n, inputs[i].dtype, states[i].seeded, states[i].amax};
    if (n > largest) largest = n;
  }
  if (jobs == 0) return;
  // Enough blocks for the largest tensor, at most a few waves: it runs
  // once per slot (later calls exit at once), so it need not be the
  // fastest amax pass.
  int64_t blocks = ceil_div(largest, int64_t(kSeedThreads) * 8);
  const int64_t max_blocks = int64_t(sm_count(op)) * 4;
  if (blocks > max_blocks) blocks = max_blocks;
  if (blocks < 1) blocks = 1;
  seed_amax_kernel<<<dim3(unsigned(blocks), unsigned(jobs)), kSeedThreads, 0, stream>>>(p);
  check_launch(op, "launching the seeding amax kernel");
}

// Greedy grouping in call order: each launch takes the first unplaced
// member and every later one with the same kernel, up to kMaxGroup. Only
// the first launch is a programmatic dependent (how.pdl): each later one
// then starts after every earlier kernel has completed.
void launch_groups(const Member* members, int count, GroupLaunch how, cudaStream_t stream,
                   const char* op) {
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
    launch_group(group, how, stream, op);
    how.pdl = false;
  }
}

}  // namespace

void quantize_delayed_update(const fp8kit_tensor* inputs, fp8kit_tensor* outputs,
                             const fp8kit_delayed_quantize_state* states,
                             const fp8kit_column_sums* sums, int count,
                             const fp8kit_delayed_scaling_config& config, bool record,
                             void* stream_ptr) {
  const char* op = "quantize_delayed_update";
  ScopedDevice device(inputs[0].device_index, op);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  launch_seed_amax(inputs, states, count, stream, op);
  Member members[kMaxMembers];
  for (int i = 0; i < count; ++i) {
    const fp8kit_delayed_quantize_state& s = states[i];
    const float fp8_max = fp8kit_fp8_max(outputs[i].dtype);
    Member& m = members[i];
    m = member_of(inputs, outputs, sums, i);
    m.job.amax = record ? s.amax : nullptr;  // not recording: no amax is needed
    m.job.scale = delayed_scale_source(s.scale, fp8_max, outputs[i].scale_inv);
    m.job.scale.seeded = s.seeded;
    m.job.scale.seed_amax = s.amax;
    m.job.scale.margin = config.margin;
    m.state = FusedState{s.amax_history, s.amax, s.scale, s.scale_inv, s.counter, s.seeded,
                         fp8_max};
  }
  GroupLaunch how{};
  how.update_states = true;
  how.update = UpdateConfig{config.amax_history_len, config.margin,
                            config.amax_reduction == FP8KIT_AMAX_MOST_RECENT ? 1 : 0,
                            record ? 1 : 0};
  launch_groups(members, count, how, stream, op);
}

void quantize_current_scaling_many(const fp8kit_tensor* inputs, fp8kit_tensor* outputs,
                                   const fp8kit_column_sums* sums, int count,
                                   const fp8kit_current_scaling_config& config,
                                   void* stream_ptr) {
  const char* op = "quantize_current_scaling_many";
  ScopedDevice device(inputs[0].device_index, op);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  Member members[kMaxMembers];
  for (int i = 0; i < count; ++i) {
    // No state (the casts run with update_states 0), no amax atomics: the
    // cast reads the finished amax instead.
    members[i] = member_of(inputs, outputs, sums, i);
    members[i].job.scale = current_scale_source(outputs[i].amax, fp8kit_fp8_max(outputs[i].dtype),
                                                config, outputs[i].scale, outputs[i].scale_inv);
  }
  launch_amax_many(inputs, outputs, count, stream, op);
  GroupLaunch how{};
  how.pdl = true;  // the first cast launch follows the amax pass
  launch_groups(members, count, how, stream, op);
}

}  // namespace cuda
}  // namespace fp8kit
