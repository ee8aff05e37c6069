#include "core_calls.h"

#include <array>
#include <mutex>

#include "descriptors.h"
#include "errors.h"

namespace fp8kit_torch {
namespace {

fp8kit_device_type fp8kit_device(const at::Device& d) {
  return d.is_cuda() ? FP8KIT_DEVICE_CUDA : FP8KIT_DEVICE_CPU;
}

int fp8kit_index(const at::Device& d) { return d.is_cuda() ? d.index() : 0; }

// cuBLASLt's workspace, one torch tensor per CUDA device, allocated once
// through PyTorch's caching allocator and kept for the life of the process
// (held by a leaked array so that no tensor is freed during interpreter or
// CUDA teardown). Work on one device is ordered on its streams by PyTorch's
// usual rules; like other libraries' cached workspaces it must not be used
// by two streams of one device at once.
constexpr int kMaxDevices = 64;

struct WorkspaceCache {
  std::mutex mu;
  std::array<at::Tensor, kMaxDevices> tensors;
};

WorkspaceCache& workspace_cache() {
  static WorkspaceCache* cache = new WorkspaceCache();
  return *cache;
}

std::pair<void*, size_t> workspace_for(const at::Device& device) {
  if (!device.is_cuda()) return {nullptr, 0};
  const int idx = device.index();
  FP8KIT_VALUE_CHECK(idx >= 0 && idx < kMaxDevices, "fp8kit: CUDA device index ", idx,
                     " is out of range");
  WorkspaceCache& c = workspace_cache();
  std::lock_guard<std::mutex> lock(c.mu);
  at::Tensor& t = c.tensors[idx];
  if (!t.defined()) {
    const size_t bytes = fp8kit_gemm_workspace_size(FP8KIT_DEVICE_CUDA);
    if (bytes == 0) return {nullptr, 0};
    t = at::empty({static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte).device(device));
  }
  return {t.data_ptr(), static_cast<size_t>(t.numel())};
}

// Tensors per grouped quantize call: a Linear quantizes at most two.
constexpr int kMaxItems = 4;

void check_item_count(int count) {
  FP8KIT_VALUE_CHECK(count >= 0 && count <= kMaxItems, "fp8kit: ", count,
                     " tensors in one grouped quantize call; at most ", kMaxItems);
}

// The descriptors of one per-tensor cast of contiguous high-precision x
// into the FP8 buffers data / columnwise_data (either may be undefined),
// with no scale pointers yet.
void describe_cast(const at::Tensor& x, fp8kit_dtype fp8, const at::Tensor& data,
                   const at::Tensor& columnwise_data, fp8kit_device_type dev, fp8kit_tensor* in,
                   fp8kit_tensor* out) {
  *in = describe(x, *high_precision_dtype(x.scalar_type()), dev);
  *out = *in;
  out->dtype = fp8;
  out->scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  out->data = data.defined() ? data.data_ptr() : nullptr;
  out->columnwise_data = columnwise_data.defined() ? columnwise_data.data_ptr() : nullptr;
}

}  // namespace

void quantize_into(const at::Tensor& x, fp8kit_dtype fp8, const at::Tensor& data,
                   const at::Tensor& columnwise_data, ScalePtrs s,
                   const fp8kit_current_scaling_config* current,
                   const fp8kit_column_sums* sums) {
  FP8KIT_PROFILE_SCOPE(current ? "fp8kit::quantize_current_scaling" : "fp8kit::quantize");
  const fp8kit_device_type dev = fp8kit_device(x.device());
  fp8kit_tensor in, out;
  describe_cast(x, fp8, data, columnwise_data, dev, &in, &out);
  out.scale = s.scale;
  out.scale_inv = s.scale_inv;
  out.amax = s.amax;
  void* stream = current_stream(x.device());
  const bool cpu = dev == FP8KIT_DEVICE_CPU;
  check_status(call_core(cpu, [&] {
    return current ? fp8kit_quantize_current_scaling(&in, &out, current, sums, stream)
                   : fp8kit_quantize(&in, &out, stream);
  }));
}

at::Tensor alloc_rowwise(const at::Tensor& x, fp8kit_dtype fp8) {
  return at::empty(x.sizes(), x.options().dtype(torch_fp8_type(fp8)));
}

at::Tensor alloc_columnwise(const at::Tensor& x, fp8kit_dtype fp8) {
  return at::empty(columnwise_shape(x.sizes()), x.options().dtype(torch_fp8_type(fp8)));
}

void dequantize_into(const at::Tensor& q, bool from_columnwise, at::IntArrayRef logical_shape,
                     fp8kit_dtype fp8, const float* scale_inv, const at::Tensor& out) {
  FP8KIT_PROFILE_SCOPE("fp8kit::dequantize");
  const fp8kit_device_type dev = fp8kit_device(q.device());
  fp8kit_tensor in = describe(out, fp8, dev);
  in.rank = static_cast<int>(logical_shape.size());
  for (int i = 0; i < in.rank; ++i) in.shape[i] = logical_shape[i];
  in.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  in.data = from_columnwise ? nullptr : q.data_ptr();
  in.columnwise_data = from_columnwise ? q.data_ptr() : nullptr;
  in.scale_inv = const_cast<float*>(scale_inv);
  fp8kit_tensor o = describe(out, *high_precision_dtype(out.scalar_type()), dev);
  void* stream = current_stream(q.device());
  check_status(call_core(dev == FP8KIT_DEVICE_CPU, [&] {
    return fp8kit_dequantize(&in, &o, from_columnwise ? 1 : 0, stream);
  }));
}

void columnwise_from_rowwise_into(const at::Tensor& data, fp8kit_dtype fp8,
                                  const at::Tensor& columnwise) {
  FP8KIT_PROFILE_SCOPE("fp8kit::columnwise_from_rowwise");
  const fp8kit_device_type dev = fp8kit_device(data.device());
  fp8kit_tensor t = describe(data, fp8, dev);
  t.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  t.columnwise_data = columnwise.data_ptr();
  void* stream = current_stream(data.device());
  check_status(call_core(dev == FP8KIT_DEVICE_CPU, [&] {
    return fp8kit_columnwise_from_rowwise(&t, stream);
  }));
}

void amax_into(const at::Tensor& x, float* amax) {
  FP8KIT_PROFILE_SCOPE("fp8kit::amax");
  const fp8kit_device_type dev = fp8kit_device(x.device());
  const fp8kit_tensor in = describe(x, *high_precision_dtype(x.scalar_type()), dev);
  void* stream = current_stream(x.device());
  check_status(call_core(dev == FP8KIT_DEVICE_CPU, [&] { return fp8kit_amax(&in, amax, stream); }));
}

void cast_statistics_into(const at::Tensor& x, fp8kit_dtype fp8, fp8kit_scaling_mode mode,
                          const at::Tensor& data, bool from_columnwise, float* scales,
                          const fp8kit_cast_statistics& out, const at::Tensor* row_scale_inv) {
  FP8KIT_PROFILE_SCOPE("fp8kit::cast_statistics");
  const fp8kit_device_type dev = fp8kit_device(x.device());
  const fp8kit_tensor in = describe(x, *high_precision_dtype(x.scalar_type()), dev);
  fp8kit_tensor q = in;  // x's logical shape; the copy's bytes and scales below
  q.dtype = fp8;
  q.scaling_mode = mode;
  q.data = from_columnwise ? nullptr : data.data_ptr();
  q.columnwise_data = from_columnwise ? data.data_ptr() : nullptr;
  if (mode == FP8KIT_SCALING_PER_TENSOR) {
    q.scale_inv = scales;
  } else if (from_columnwise) {
    q.columnwise_block_scale_inv = scales;
  } else {
    q.block_scale_inv = scales;
  }
  // The CUDA kernels' scratch comes from the caching allocator, ordered on
  // this stream like every tensor of the call.
  fp8kit_cast_statistics outputs = out;
  at::Tensor workspace;
  if (dev != FP8KIT_DEVICE_CPU) {
    workspace = at::empty({FP8KIT_CAST_STATISTICS_WORKSPACE_BYTES}, x.options().dtype(at::kByte));
    outputs.workspace = workspace.data_ptr();
  }
  void* stream = current_stream(x.device());
  if (row_scale_inv != nullptr) {
    const fp8kit_tensor rows = describe(*row_scale_inv, FP8KIT_FLOAT32, dev);
    check_status(call_core(dev == FP8KIT_DEVICE_CPU, [&] {
      return fp8kit_cast_statistics_of_rows(&in, &q, &rows, &outputs, stream);
    }));
    return;
  }
  check_status(call_core(dev == FP8KIT_DEVICE_CPU, [&] {
    return fp8kit_cast_statistics_of(&in, &q, from_columnwise ? 1 : 0, &outputs, stream);
  }));
}

void delayed_update(const fp8kit_delayed_scaling_state* states, int count,
                    const fp8kit_delayed_scaling_config& config, const at::Device& device) {
  if (count == 0) return;
  FP8KIT_PROFILE_SCOPE("fp8kit::delayed_scaling_update");
  void* stream = current_stream(device);
  check_status(call_core(!device.is_cuda(), [&] {
    return fp8kit_delayed_scaling_update(states, count, &config, fp8kit_device(device),
                                         fp8kit_index(device), stream);
  }));
}

void quantize_delayed_update_into(const DelayedQuantizeItem* items, int count,
                                  const fp8kit_delayed_scaling_config& config, bool record,
                                  const at::Device& device) {
  FP8KIT_PROFILE_SCOPE("fp8kit::quantize_delayed_update");
  check_item_count(count);
  const fp8kit_device_type dev = fp8kit_device(device);
  fp8kit_tensor in[kMaxItems], out[kMaxItems];
  fp8kit_delayed_quantize_state st[kMaxItems];
  fp8kit_column_sums sums[kMaxItems];
  for (int i = 0; i < count; ++i) {
    const DelayedQuantizeItem& it = items[i];
    describe_cast(*it.x, it.fp8, *it.data, *it.columnwise_data, dev, &in[i], &out[i]);
    out[i].scale = nullptr;
    out[i].scale_inv = it.scale_inv;
    out[i].amax = nullptr;
    st[i] = it.state;
    sums[i] = it.sums;
  }
  void* stream = current_stream(device);
  check_status(call_core(dev == FP8KIT_DEVICE_CPU, [&] {
    return fp8kit_quantize_delayed_update(in, out, st, sums, count, &config, record ? 1 : 0,
                                          stream);
  }));
}

void quantize_current_into(const CurrentQuantizeItem* items, int count,
                           const fp8kit_current_scaling_config& config, const at::Device& device) {
  FP8KIT_PROFILE_SCOPE("fp8kit::quantize_current_scaling_many");
  check_item_count(count);
  const fp8kit_device_type dev = fp8kit_device(device);
  fp8kit_tensor in[kMaxItems], out[kMaxItems];
  fp8kit_column_sums sums[kMaxItems];
  for (int i = 0; i < count; ++i) {
    const CurrentQuantizeItem& it = items[i];
    describe_cast(*it.x, it.fp8, *it.data, *it.columnwise_data, dev, &in[i], &out[i]);
    out[i].scale = it.s.scale;
    out[i].scale_inv = it.s.scale_inv;
    out[i].amax = it.s.amax;
    sums[i] = it.sums;
  }
  void* stream = current_stream(device);
  check_status(call_core(dev == FP8KIT_DEVICE_CPU, [&] {
    return fp8kit_quantize_current_scaling_many(in, out, sums, count, &config, stream);
  }));
}

fp8kit_tensor gemm_operand(const at::Device& device, fp8kit_dtype fp8, int64_t rows, int64_t cols,
                           void* data, void* columnwise_data, const float* scale_inv) {
  fp8kit_tensor t;
  std::memset(&t, 0, sizeof(t));
  t.device_type = fp8kit_device(device);
  t.device_index = fp8kit_index(device);
  t.dtype = fp8;
  t.rank = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  t.data = data;
  t.columnwise_data = columnwise_data;
  t.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  t.scale_inv = const_cast<float*>(scale_inv);
  return t;
}

void gemm_call(const fp8kit_tensor& a, const fp8kit_tensor& b, fp8kit_tensor& d,
               fp8kit_gemm_config config, const at::Device& device) {
  FP8KIT_PROFILE_SCOPE("fp8kit::gemm");
  const auto ws = workspace_for(device);
  config.workspace = ws.first;
  config.workspace_bytes = ws.second;
  void* stream = current_stream(device);
  check_status(call_core(!device.is_cuda(), [&] { return fp8kit_gemm(&a, &b, &d, &config, stream); }));
}

bool supports_non_tn(const at::Device& device) {
  int supported = 0;
  check_status(fp8kit_supports_non_tn_fp8_gemm(fp8kit_device(device), fp8kit_index(device),
                                                &supported));
  return supported != 0;
}

at::Device capability_query_device(const char* fn, const at::Device& device_in) {
  at::Device device = device_in;
  if (device.is_cuda() && !device.has_index()) {
#ifdef FP8KIT_TORCH_CUDA
    device = at::Device(at::kCUDA, c10::cuda::current_device());
#else
    C10_THROW_ERROR(NotImplementedError,
                    c10::str(fn, ": this fp8kit build has no CUDA support; rebuild it on a "
                             "machine with a CUDA toolkit"));
#endif
  }
  FP8KIT_VALUE_CHECK(device.is_cpu() || device.is_cuda(), fn, ": device is ", device_str(device),
                     "; ask about a CPU or CUDA device");
  return device;
}

}  // namespace fp8kit_torch
