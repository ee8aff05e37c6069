#include "fused_tensors.h"

#include "descriptors.h"
#include "errors.h"

namespace py = pybind11;

namespace fp8kit_torch {
namespace {

// The fused kernels read and write 16-byte vectors; the core refuses other
// pointers on the CPU too, so the message here says how to get one.
void check_aligned(const char* fn, const char* arg, const at::Tensor& t) {
  FP8KIT_VALUE_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, fn, ": ", arg,
                     "'s data is not 16-byte aligned (a view starting inside another tensor); "
                     "the fused kernels use 16-byte vectors: pass ", arg, ".clone()");
}

}  // namespace

at::Tensor fused_input(const char* fn, const char* arg, const at::Tensor& t) {
  check_high_precision(fn, arg, t);
  FP8KIT_VALUE_CHECK(t.dim() >= 1, fn, ": ", arg, " is 0-d; it must be [..., features]");
  check_rank(fn, arg, t);
  device_type_of(t, fn, arg);
  const at::Tensor c = t.contiguous();
  check_aligned(fn, arg, c);
  return c;
}

at::Tensor fused_input(const char* fn, const char* arg, const at::Tensor& t,
                       const LinearState& st) {
  const at::Tensor c = fused_input(fn, arg, t);
  FP8KIT_VALUE_CHECK(c.device() == st.device, fn, ": ", arg, " is on ", device_str(c.device()),
                     " but the scaling state is on ", device_str(st.device), "; move ", arg,
                     " or the state (state.to(", arg, ".device))");
  return c;
}

at::Tensor fused_like(const char* fn, const char* arg, const at::Tensor& t, const at::Tensor& ref,
                      const char* ref_arg) {
  return fused_like(fn, arg, t, ref, ref_arg, ref.sizes());
}

at::Tensor fused_like(const char* fn, const char* arg, const at::Tensor& t, const at::Tensor& ref,
                      const char* ref_arg, at::IntArrayRef shape) {
  check_high_precision(fn, arg, t);
  FP8KIT_TYPE_CHECK(t.scalar_type() == ref.scalar_type(), fn, ": ", arg, " has dtype ",
                    dtype_str(t.scalar_type()), " but ", ref_arg, " has dtype ",
                    dtype_str(ref.scalar_type()), "; convert it (", arg, ".to(", ref_arg,
                    ".dtype))");
  FP8KIT_VALUE_CHECK(t.sizes() == shape, fn, ": ", arg, " has shape ", shape_str(t.sizes()),
                     " but must be ", shape_str(shape));
  check_same_device(fn, arg, t, ref_arg, ref);
  const at::Tensor c = t.contiguous();
  check_aligned(fn, arg, c);
  return c;
}

void check_param(const char* fn, const char* arg, const at::Tensor& p, const at::Tensor& x,
                 int64_t hidden) {
  check_high_precision(fn, arg, p);
  FP8KIT_TYPE_CHECK(p.scalar_type() == x.scalar_type(), fn, ": ", arg, " has dtype ",
                    dtype_str(p.scalar_type()), " but x has dtype ", dtype_str(x.scalar_type()),
                    "; they must match (", arg, ".to(x.dtype))");
  FP8KIT_VALUE_CHECK(p.dim() == 1 && p.size(0) == hidden, fn, ": ", arg, " has shape ",
                     shape_str(p.sizes()), " but x's last dimension is ", hidden, "; ", arg,
                     " must be [", hidden, "]");
  check_same_device(fn, arg, p, "x", x);
  check_contiguous(fn, arg, p);
  check_aligned(fn, arg, p);
}

at::Tensor row_stats(const char* fn, const char* arg, const at::Tensor& t, const at::Tensor& x,
                     int64_t rows) {
  check_dense(fn, arg, t);
  FP8KIT_TYPE_CHECK(t.scalar_type() == at::kFloat, fn, ": ", arg, " has dtype ",
                    dtype_str(t.scalar_type()), "; it must be the float32 ", arg,
                    " the forward returned");
  FP8KIT_VALUE_CHECK(t.dim() == 1 && t.size(0) == rows, fn, ": ", arg, " has shape ",
                     shape_str(t.sizes()), " but x has ", rows, " rows; pass the ", arg,
                     " the forward of this x returned");
  check_same_device(fn, arg, t, "x", x);
  return t.contiguous();
}

std::optional<at::ScalarType> read_sums_dtype(const char* fn, py::handle sums_dtype) {
  if (sums_dtype.is_none()) return std::nullopt;
  FP8KIT_TYPE_CHECK(THPDtype_Check(sums_dtype.ptr()), fn, ": sums_dtype is ",
                    py::str(sums_dtype).cast<std::string>(),
                    "; it must be None or a torch.dtype (the bias's)");
  return reinterpret_cast<THPDtype*>(sums_dtype.ptr())->scalar_type;
}

void check_sums_dtype(const char* fn, std::optional<at::ScalarType> sums_dtype, bool columnwise,
                      int64_t rows, int64_t cols, const char* input) {
  if (!sums_dtype) return;
  FP8KIT_TYPE_CHECK(high_precision_dtype(*sums_dtype).has_value(), fn, ": sums_dtype is ",
                    dtype_str(*sums_dtype), "; use torch.float32, torch.bfloat16 or torch.float16");
  FP8KIT_VALUE_CHECK(columnwise && rows > 1 && cols > 1, fn,
                     ": column sums come out of the cast+transpose pass: they need "
                     "columnwise=True and ", input, " with more than one row and column (sum ",
                     input, " yourself otherwise)");
}

at::ScalarType read_high_precision_dtype(py::handle dtype, const char* fn, const char* arg) {
  const bool is_dtype = THPDtype_Check(dtype.ptr());
  const at::ScalarType t =
      is_dtype ? reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type : at::kFloat;
  FP8KIT_TYPE_CHECK(is_dtype && high_precision_dtype(t).has_value(), fn, ": ", arg, " is ",
                    py::str(dtype).cast<std::string>(),
                    "; use torch.float32, torch.bfloat16 or torch.float16");
  return t;
}

py::object optional_tensor(const at::Tensor& t) {
  if (!t.defined()) return py::none();
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(t));
}

}  // namespace fp8kit_torch
