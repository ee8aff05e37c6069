#include "grouped_args.h"

#include "descriptors.h"
#include "errors.h"

namespace fp8kit_torch {

int64_t check_group_sizes(const char* fn, const at::Tensor& sizes, const at::Tensor& x) {
  FP8KIT_TYPE_CHECK(sizes.scalar_type() == at::kLong, fn, ": group_sizes has dtype ",
                    dtype_str(sizes.scalar_type()), "; pass the counts as torch.int64");
  FP8KIT_VALUE_CHECK(sizes.dim() == 1 && sizes.size(0) >= 1, fn, ": group_sizes has shape ",
                     shape_str(sizes.sizes()), "; it must be [num_groups], one count per group");
  FP8KIT_VALUE_CHECK(sizes.device().is_cpu() || sizes.device() == x.device(), fn,
                     ": group_sizes is on ", device_str(sizes.device()), " but the tensors are "
                     "on ", device_str(x.device()), "; pass the counts on the CPU or on ",
                     device_str(x.device()));
  check_contiguous(fn, "group_sizes", sizes);
  return sizes.size(0);
}

fp8kit_tensor describe_group_sizes(const at::Tensor& sizes) {
  return describe(sizes, FP8KIT_INT64,
                  sizes.device().is_cuda() ? FP8KIT_DEVICE_CUDA : FP8KIT_DEVICE_CPU);
}

GroupedCast grouped_cast(const char* fn, const at::Tensor& x_in, const at::Tensor& group_sizes,
                         at::ScalarType fp8_dtype, bool rowwise, bool columnwise) {
  const std::optional<fp8kit_dtype> f = fp8_dtype_of(fp8_dtype);
  FP8KIT_TYPE_CHECK(f.has_value(), fn, ": fp8_dtype is ", dtype_str(fp8_dtype),
                    "; use torch.float8_e4m3fn or torch.float8_e5m2");
  FP8KIT_VALUE_CHECK(rowwise || columnwise, fn,
                     ": rowwise and columnwise are both False; ask for at least one copy");
  GroupedCast c;
  c.x = contiguous_high_precision(fn, "x", x_in);
  FP8KIT_VALUE_CHECK(c.x.dim() == 2, fn, ": x has shape ", shape_str(c.x.sizes()),
                     "; it must be [tokens, features], the tokens sorted by group");
  c.groups = check_group_sizes(fn, group_sizes, c.x);
  c.device = device_type_of(c.x, fn, "x");
  const int64_t tokens = c.x.size(0), features = c.x.size(1);
  const auto fp8 = c.x.options().dtype(fp8_dtype);
  const auto f32 = c.x.options().dtype(at::kFloat);
  c.data = rowwise ? at::empty({tokens, features}, fp8) : at::empty({0}, fp8);
  c.columnwise = at::empty(
      {columnwise ? features * fp8kit_grouped_columnwise_tokens(tokens, c.groups) : 0}, fp8);
  c.scale_inv = at::zeros({c.groups, FP8KIT_GROUP_SCALE_STRIDE}, f32);
  c.amax = at::zeros({c.groups, FP8KIT_GROUP_SCALE_STRIDE}, f32);
  c.input = describe(c.x, *high_precision_dtype(c.x.scalar_type()), c.device);
  c.output = c.input;
  c.output.dtype = *f;
  c.output.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  c.output.data = rowwise ? c.data.data_ptr() : nullptr;
  c.output.columnwise_data = columnwise ? c.columnwise.data_ptr() : nullptr;
  c.output.scale_inv = c.scale_inv.data_ptr<float>();
  c.output.amax = c.amax.data_ptr<float>();
  return c;
}

void check_group_scales(const char* fn, const char* arg, const at::Tensor& t, int64_t groups,
                        const at::Tensor& ref) {
  constexpr int64_t stride = FP8KIT_GROUP_SCALE_STRIDE;
  FP8KIT_TYPE_CHECK(t.scalar_type() == at::kFloat, fn, ": ", arg, " has dtype ",
                    dtype_str(t.scalar_type()), "; per-group scales are torch.float32");
  FP8KIT_VALUE_CHECK(t.dim() == 2 && t.size(0) == groups && t.size(1) == stride, fn, ": ", arg,
                     " has shape ", shape_str(t.sizes()), " but [", groups, ", ", stride,
                     "] is expected (one group's scale per row, in column 0)");
  check_contiguous(fn, arg, t);
  check_same_device(fn, arg, t, "the data", ref);
}

}  // namespace fp8kit_torch
