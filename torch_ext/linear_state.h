// One Linear layer's FP8 state (LinearState): its recipe, the
// delayed-scaling history, amax, scale and scale_inv of its three slots
// (input, weight, grad_output), the cached quantized weight, the lock that
// orders forward and backward use of all that, and its checkpoint form.
#ifndef FP8KIT_TORCH_EXT_LINEAR_STATE_H_
#define FP8KIT_TORCH_EXT_LINEAR_STATE_H_

#include <array>
#include <mutex>
#include <vector>

#include "carve.h"
#include "fp8kit/linear.h"
#include "linear_recipe.h"
#include "torch_includes.h"

namespace fp8kit_torch {

constexpr int kInput = FP8KIT_SLOT_INPUT, kWeight = FP8KIT_SLOT_WEIGHT,
              kGrad = FP8KIT_SLOT_GRAD_OUTPUT, kSlots = FP8KIT_NUM_SLOTS;

// Per-quantization scalars: scale, scale_inv and amax, each at a 16-byte
// aligned offset (cuBLASLt reads scale_inv through 16-byte aligned
// pointers). Every quantization gets its own, so a saved tensor's scale_inv
// never changes under it (the layer's delayed-scaling scale_inv does, at
// its next quantization). Delayed scaling writes only the scale_inv (scale
// and amax live in the layer's state).
constexpr int kScale = 0, kScaleInv = 4, kAmax = 8, kScalars = 12;

// One cast's scale_inv where a call uses it: in the cast's scalars block
// (block: the float at kScaleInv) or a float32 [1] tensor (a cast made
// elsewhere). The [1] tensor of a block (over its storage) is made only
// where one is kept or recorded: even part_of costs a small layer's call
// time.
struct ScaleInv {
  at::Tensor owner;
  bool block;
  float* ptr() const { return owner.data_ptr<float>() + (block ? kScaleInv : 0); }
  at::Tensor tensor() const {
    const int64_t one[1] = {1};
    return block ? part_of(owner, kScaleInv, one) : owner;
  }
};

// One quantization of a forward or backward: the layer's slot, the
// contiguous input, its FP8 outputs (either may be undefined) and where its
// scalars go (kScale / kScaleInv / kAmax floats from there).
struct SlotJob {
  int slot;
  const at::Tensor* x;
  at::Tensor data, columnwise_data;
  float* scalars;
  fp8kit_column_sums sums{};  // sums.sums == NULL: none
};

// Locks `mu` without ever blocking while this thread holds the GIL: a thread
// holding mu may itself wait for the GIL (CPU work releases and re-takes it),
// so waiting for mu with the GIL held could deadlock.
std::unique_lock<std::mutex> lock_state(std::mutex& mu);

struct LinearState : torch::CustomClassHolder {
  LinearState(const LinearRecipe& recipe, const at::Device& device);
  // A state over the given tensors (the dispatcher ops' arguments, checked
  // by the caller): quantizations read and write them. Its seeded mirror
  // starts all unseeded, so every delayed-scaling quantization hands the
  // core the device flags, which tell it the slots already seeded (the same
  // bits as the mirror's shortcut); it caches no weight.
  LinearState(const LinearRecipe& recipe, const at::Tensor& history, const at::Tensor& amax,
              const at::Tensor& scale, const at::Tensor& scale_inv, const at::Tensor& counters,
              const at::Tensor& seeded_flags);

  fp8kit_dtype slot_dtype(int slot) const {
    return slot == kGrad ? recipe.backward_dtype : recipe.forward_dtype;
  }

  // Quantizes `jobs`, `record` telling whether the pass computes gradients
  // (fp8kit/linear.h). Delayed scaling (caller holds mu): all jobs in one
  // fused quantize-and-update call, which seeds an unseeded slot from the
  // tensor's own amax and, when recording, rolls each amax into its slot's
  // history as it casts. Current scaling: one call per job, from the
  // tensor's own amax.
  void quantize_slots(const SlotJob* jobs, int n, bool record);

  // Tile counters of the bias gradient's column sums with room for an
  // N-column gradient. Caller holds mu.
  unsigned int* sum_counters_for(int64_t n);

  // Whether the cached FP8 weight is `w` as it is now (same tensor, same
  // storage, same version counter) and holds the copies `need` names.
  bool weight_cached(const at::Tensor& w, fp8kit_copies need) const;
  // Keeps the weight's FP8 pieces for the next call with `w` unchanged.
  void keep_weight(const at::Tensor& w, const at::Tensor& data, const at::Tensor& columnwise,
                   const at::Tensor& scalars);
  void clear_weight_cache();

  // Moves the state tensors to `device` (caller holds mu).
  void move_to(const at::Device& device);

  // Checkpoint form: the recipe as plain values, CPU copies of the state
  // tensors and the seeded flags; and the state a checkpoint describes
  // (every entry checked: errors name it after `where`, the checkpoint
  // entry being loaded).
  pybind11::dict checkpoint();
  // Which slots are seeded, read from the device flags (caller holds mu):
  // the dispatcher ops run the core on a state over this state's tensors,
  // which sets the flags but not this state's mirror.
  std::vector<bool> seeded_slots() const;
  static c10::intrusive_ptr<LinearState> from_checkpoint(pybind11::handle saved,
                                                         const at::Device& device,
                                                         const std::string& where);

  const LinearRecipe recipe;
  at::Device device;
  bool non_tn = false;  // the core's answer for `device`

  // Delayed-scaling state, float32 on `device`: history [3, amax_history_len]
  // (column 0 newest), amax accumulators (0 between calls), scale,
  // scale_inv [3]; the fused quantize's block counters (int32 [3], 0
  // between calls) and the core's seeded flags (float32 [3]: 0 until the
  // slot's first recorded quantization).
  at::Tensor history, amax, scale, scale_inv, counters, seeded_flags;
  // Host mirror of seeded_flags, set with them by this state's own
  // quantizations: a slot's flag is passed to the core only while unseeded,
  // which spares seeded slots the core's seeding launch. Not the truth for
  // others (seeded_slots() is): the dispatcher ops set only the flags.
  std::array<bool, kSlots> seeded{};
  // Tile counters of the bias gradient's column sums (int32, 0 between
  // calls), made by the first backward that computes the sums in the cast.
  at::Tensor sum_counters;
  // Orders forward (caller's thread) and backward (autograd thread) use of
  // the delayed-scaling state, the seeded mirror, the column sums' counters
  // and the weight cache.
  std::mutex mu;

  // Cached quantized weight, reused while the weight is unchanged.
  bool cache_weight = false;  // opt-in (fp8kit/torch/linear.py says why)
  at::Tensor w_src, w_data, w_columnwise, w_scalars;
  const void* w_ptr = nullptr;
  int64_t w_version = -1;
};

// A new state for `recipe` on `device` (a CPU or CUDA device; CUDA without
// an index means the current one).
c10::intrusive_ptr<LinearState> make_linear_state(const LinearRecipe& recipe,
                                                  const at::Device& device);

}  // namespace fp8kit_torch

#endif  // FP8KIT_TORCH_EXT_LINEAR_STATE_H_
