#include "carve.h"

namespace fp8kit_torch {
namespace {

constexpr int64_t kAlign = 256;

int64_t numel_of(at::IntArrayRef sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

}  // namespace

void carve(const at::Device& device, const Piece* pieces, int n, at::Tensor* out) {
  int64_t offsets[8];
  TORCH_CHECK(n <= 8, "fp8kit: carve takes at most 8 pieces");
  int64_t bytes = 0;
  for (int i = 0; i < n; ++i) {
    out[i] = at::Tensor();
    if (!pieces[i].wanted) continue;
    offsets[i] = bytes;
    const int64_t size = numel_of(pieces[i].sizes) * int64_t(c10::elementSize(pieces[i].dtype));
    bytes += (size + kAlign - 1) / kAlign * kAlign;
  }
  if (bytes == 0) bytes = kAlign;  // all pieces empty: still a valid storage
  const at::Tensor buffer = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(device));
  for (int i = 0; i < n; ++i) {
    if (!pieces[i].wanted) continue;
    // A tensor of its own (not a view) over the buffer's storage, as
    // at::empty would make it: same dispatch keys, the piece's dtype,
    // contiguous sizes, the piece's offset in elements.
    at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
        c10::Storage(buffer.storage()), buffer.key_set(),
        c10::scalarTypeToTypeMeta(pieces[i].dtype));
    c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    impl->set_sizes_contiguous(pieces[i].sizes);
    impl->set_storage_offset(offsets[i] / int64_t(c10::elementSize(pieces[i].dtype)));
    out[i] = std::move(t);
  }
}

}  // namespace fp8kit_torch
