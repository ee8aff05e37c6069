#include "carve.h"

namespace fp8kit_torch {
namespace {

constexpr int64_t kAlign = 256;

int64_t bytes_of(const Piece& p) {
  int64_t n = 1;
  for (int64_t s : p.sizes) n *= s;
  return n * int64_t(c10::elementSize(p.dtype));
}

// A tensor of its own (not a view) over `buffer`'s storage, as at::empty
// would make it: same dispatch keys, the piece's dtype, contiguous sizes,
// starting `offset` bytes in.
at::Tensor piece_of(const at::Tensor& buffer, const Piece& p, int64_t offset) {
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(buffer.storage()), buffer.key_set(), c10::scalarTypeToTypeMeta(p.dtype));
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(p.sizes);
  impl->set_storage_offset(offset / int64_t(c10::elementSize(p.dtype)));
  return t;
}

}  // namespace

at::Tensor part_of(const at::Tensor& t, int64_t offset, at::IntArrayRef sizes) {
  at::Tensor p = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(t.storage()), t.key_set(),
                                                          t.dtype());
  c10::TensorImpl* impl = p.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(sizes);
  impl->set_storage_offset(t.storage_offset() + offset);
  return p;
}

void carve(const at::Device& device, const Piece* pieces, int n, at::Tensor* out) {
  TORCH_CHECK(n >= 0 && n <= kMaxPieces, "fp8kit: carve takes at most ", kMaxPieces, " pieces");
  bool done[kMaxPieces] = {};
  for (int i = 0; i < n; ++i) {
    out[i] = at::Tensor();
    done[i] = !pieces[i].wanted;
  }
  for (int first = 0; first < n; ++first) {
    if (done[first]) continue;
    // Every wanted piece with this lifetime, packed at aligned offsets.
    const int lifetime = pieces[first].lifetime;
    int64_t offsets[kMaxPieces];
    int64_t bytes = 0;
    for (int i = first; i < n; ++i) {
      if (done[i] || pieces[i].lifetime != lifetime) continue;
      offsets[i] = bytes;
      bytes += (bytes_of(pieces[i]) + kAlign - 1) / kAlign * kAlign;
    }
    const at::Tensor buffer = at::empty({bytes > 0 ? bytes : kAlign},
                                        at::TensorOptions().dtype(at::kByte).device(device));
    for (int i = first; i < n; ++i) {
      if (done[i] || pieces[i].lifetime != lifetime) continue;
      out[i] = piece_of(buffer, pieces[i], offsets[i]);
      done[i] = true;
    }
  }
}

}  // namespace fp8kit_torch
