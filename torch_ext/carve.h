// Several tensors carved out of one allocation per lifetime.
//
// Why: on a small layer every caching-allocator call is a visible share of
// the per-call time, and a Linear forward needs up to six buffers besides
// its output. Tensors freed together (those saved for backward; those used
// only inside the call) share one buffer, so a forward makes three
// allocations instead of six. Pieces of different lifetimes
// never share a buffer: a buffer lives as long as its longest-lived piece.
#ifndef FP8KIT_TORCH_EXT_CARVE_H_
#define FP8KIT_TORCH_EXT_CARVE_H_

#include <cstdint>

#include "torch_includes.h"

namespace fp8kit_torch {

// One requested tensor: contiguous `sizes` of `dtype`, or nothing (the
// result stays undefined) when `wanted` is false. Pieces with the same
// `lifetime` (any small int the caller chooses) share one allocation.
struct Piece {
  bool wanted;
  at::ScalarType dtype;
  at::IntArrayRef sizes;
  int lifetime;
};

// Allocates one buffer per distinct lifetime among the wanted pieces on
// `device` (through PyTorch's allocator, on its current stream) and returns
// a contiguous tensor per wanted piece in out[i], each starting at a
// 256-byte aligned offset (the alignment cuBLASLt's fastest kernels want).
// At most kMaxPieces pieces.
constexpr int kMaxPieces = 8;
void carve(const at::Device& device, const Piece* pieces, int n, at::Tensor* out);

// A contiguous tensor of `sizes` over t's storage from `offset` elements
// past t's own start, in t's dtype: as a piece above, a tensor of its own
// (no view, no dispatcher call: a narrow() costs a small layer's call
// microseconds in backward).
at::Tensor part_of(const at::Tensor& t, int64_t offset, at::IntArrayRef sizes);

}  // namespace fp8kit_torch

#endif  // FP8KIT_TORCH_EXT_CARVE_H_
