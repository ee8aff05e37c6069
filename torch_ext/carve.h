// Several tensors of one lifetime carved out of a single allocation.
//
// Why: on a small layer every caching-allocator call is a visible share of
// the per-call time (ANCHORS.md P4), and a Linear forward needs up to five
// buffers besides its output. Tensors that are freed together (those saved
// for backward; those used only inside the call) are carved from one
// buffer, so a forward makes three allocations instead of six. Never carve
// tensors with different lifetimes together: the buffer lives as long as
// the longest-lived piece.
#ifndef FP8KIT_TORCH_EXT_CARVE_H_
#define FP8KIT_TORCH_EXT_CARVE_H_

#include <cstdint>

#include "torch_includes.h"

namespace fp8kit_torch {

// One requested tensor: contiguous `sizes` of `dtype`, or nothing (the
// result stays undefined) when `wanted` is false.
struct Piece {
  bool wanted;
  at::ScalarType dtype;
  at::IntArrayRef sizes;
};

// Allocates one buffer on `device` (through PyTorch's allocator, on its
// current stream) and returns a contiguous tensor per wanted piece, each
// starting at a 256-byte aligned offset (the alignment cuBLASLt's fastest
// kernels want). `out` has n entries.
void carve(const at::Device& device, const Piece* pieces, int n, at::Tensor* out);

}  // namespace fp8kit_torch

#endif  // FP8KIT_TORCH_EXT_CARVE_H_
