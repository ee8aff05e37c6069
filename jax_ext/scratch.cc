#include "scratch.h"

#include "fp8kit/fp8kit.h"

namespace fp8kit_jax {
namespace {

constexpr size_t kAlign = 16;

size_t Aligned(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Column-sum tile counters: one per 128 columns (fp8kit_column_sums).
size_t SumCounters(int64_t cols) { return cols > 0 ? static_cast<size_t>((cols + 127) / 128) : 0; }

}  // namespace

ScratchLayout::ScratchLayout(const std::vector<ScratchTensor>& tensors, bool with_state)
    : offsets_(tensors.size() * kPieces, 0) {
  // Each piece's size in bytes for tensor t.
  auto size = [&](const ScratchTensor& t, int piece) -> size_t {
    switch (piece) {
      case kCounter: return with_state ? sizeof(unsigned int) : 0;
      case kAmax: return with_state ? sizeof(float) : 0;
      case kScaleInv: return with_state ? sizeof(float) : 0;
      case kSumCounters: return t.sums ? SumCounters(t.cols) * sizeof(unsigned int) : 0;
      default:
        return t.sums ? static_cast<size_t>(fp8kit_column_sums_workspace(t.rows, t.cols)) *
                            sizeof(float)
                      : 0;
    }
  };
  // Zeroed pieces first (enum order), for all tensors, then the rest.
  size_t at = 0;
  for (int piece = 0; piece < kPieces; ++piece) {
    if (piece == kScaleInv) zeroed_bytes_ = at;
    for (size_t i = 0; i < tensors.size(); ++i) {
      offsets_[i * kPieces + piece] = at;
      at += Aligned(size(tensors[i], piece));
    }
  }
  bytes_ = at;
}

}  // namespace fp8kit_jax
