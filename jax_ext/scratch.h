// The scratch memory a quantize call needs besides its results, carved out
// of one uint8 "workspace" result that XLA allocates with the program's
// temporaries (no allocation per call, nothing user-visible). fp8kit.jax
// sizes that result at trace time with the same layout (the module's
// workspace_bytes), so the two cannot disagree.
//
// Layout, every piece 16-byte aligned: first what the core needs zeroed on
// entry (the fused delayed call's per-tensor block counters and amax
// accumulators, the column-sum tile counters), cleared by one memset per
// call; then plain scratch (the state's scale_inv the fused call writes
// and nobody reads, the column-sum partials).
#ifndef FP8KIT_JAX_EXT_SCRATCH_H_
#define FP8KIT_JAX_EXT_SCRATCH_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fp8kit_jax {

// One quantized tensor of a call: its 2-D view and whether its column sums
// are computed.
struct ScratchTensor {
  int64_t rows;
  int64_t cols;
  bool sums;
};

class ScratchLayout {
 public:
  // with_state: the per-tensor state scratch of fp8kit_quantize_delayed_update.
  ScratchLayout(const std::vector<ScratchTensor>& tensors, bool with_state);

  size_t bytes() const { return bytes_; }
  size_t zeroed_bytes() const { return zeroed_bytes_; }

  // Pieces of tensor i inside a workspace of bytes() bytes at `base`.
  unsigned int* counter(void* base, size_t i) const { return At<unsigned int>(base, i, kCounter); }
  float* amax(void* base, size_t i) const { return At<float>(base, i, kAmax); }
  float* scale_inv(void* base, size_t i) const { return At<float>(base, i, kScaleInv); }
  unsigned int* sum_counters(void* base, size_t i) const {
    return At<unsigned int>(base, i, kSumCounters);
  }
  float* sum_partials(void* base, size_t i) const { return At<float>(base, i, kSumPartials); }

 private:
  enum Piece { kCounter, kAmax, kSumCounters, kScaleInv, kSumPartials, kPieces };
  template <typename T>
  T* At(void* base, size_t i, Piece p) const {
    return reinterpret_cast<T*>(static_cast<char*>(base) + offsets_[i * kPieces + p]);
  }
  std::vector<size_t> offsets_;  // [tensor * kPieces + piece]
  size_t zeroed_bytes_ = 0;
  size_t bytes_ = 0;
};

}  // namespace fp8kit_jax

#endif  // FP8KIT_JAX_EXT_SCRATCH_H_
