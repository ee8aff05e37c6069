// fp8kit._jax_ext: exports the XLA FFI handlers as PyCapsules, plus the few
// core queries the Python layer needs at trace time (capability, dtype
// codes). The Python side (fp8kit/jax/_registry.py)
// registers every capsule with jax.ffi.register_ffi_target on import.
#include <pybind11/pybind11.h>

#include <string>

#include "fp8kit/fp8kit.h"
#include "handlers.h"

namespace py = pybind11;

namespace {

struct Target {
  const char* name;     // the custom-call target name seen in HLO
  void* cpu;            // XLA_FFI_Handler* for platform "cpu"
  void* cuda;           // XLA_FFI_Handler* for platform "CUDA", or nullptr
};

template <typename Fn>
void* Ptr(Fn* fn) {
  return reinterpret_cast<void*>(fn);
}

#ifdef FP8KIT_WITH_CUDA
#define FP8KIT_CUDA_HANDLER(fn) Ptr(fn)
#else
#define FP8KIT_CUDA_HANDLER(fn) nullptr
#endif

const Target kTargets[] = {
    {"fp8kit_amax", Ptr(fp8kit_jax_amax_cpu), FP8KIT_CUDA_HANDLER(fp8kit_jax_amax_cuda)},
    {"fp8kit_quantize", Ptr(fp8kit_jax_quantize_cpu),
     FP8KIT_CUDA_HANDLER(fp8kit_jax_quantize_cuda)},
    {"fp8kit_quantize_current_scaling", Ptr(fp8kit_jax_quantize_current_scaling_cpu),
     FP8KIT_CUDA_HANDLER(fp8kit_jax_quantize_current_scaling_cuda)},
    {"fp8kit_compute_scale", Ptr(fp8kit_jax_compute_scale_cpu),
     FP8KIT_CUDA_HANDLER(fp8kit_jax_compute_scale_cuda)},
    {"fp8kit_dequantize", Ptr(fp8kit_jax_dequantize_cpu),
     FP8KIT_CUDA_HANDLER(fp8kit_jax_dequantize_cuda)},
    {"fp8kit_delayed_scaling_update", Ptr(fp8kit_jax_delayed_scaling_update_cpu),
     FP8KIT_CUDA_HANDLER(fp8kit_jax_delayed_scaling_update_cuda)},
    {"fp8kit_gemm", Ptr(fp8kit_jax_gemm_cpu), FP8KIT_CUDA_HANDLER(fp8kit_jax_gemm_cuda)},
};

// {target name: {"cpu": capsule, "CUDA": capsule}} (no "CUDA" key in a
// CPU-only build).
py::dict Registrations() {
  py::dict out;
  for (const Target& t : kTargets) {
    py::dict platforms;
    platforms["cpu"] = py::capsule(t.cpu);
    if (t.cuda != nullptr) platforms["CUDA"] = py::capsule(t.cuda);
    out[t.name] = platforms;
  }
  return out;
}

// Raises a Python exception carrying the core's message for a failed call.
void Check(fp8kit_status status) {
  if (status == FP8KIT_OK) return;
  std::string message = fp8kit_last_error();
  if (status == FP8KIT_INVALID_ARGUMENT) throw py::value_error(message);
  throw std::runtime_error(message);
}

fp8kit_device_type DeviceType(const std::string& platform) {
  if (platform == "cpu") return FP8KIT_DEVICE_CPU;
  if (platform == "cuda" || platform == "gpu") return FP8KIT_DEVICE_CUDA;
  throw py::value_error("fp8kit: unknown platform '" + platform +
                        "'; expected 'cpu' or 'cuda' (jax.Device.platform)");
}

}  // namespace

PYBIND11_MODULE(_jax_ext, m) {
  m.doc() = "fp8kit's XLA FFI handlers (PyCapsules) and core queries for fp8kit.jax";
  m.def("registrations", &Registrations,
        "Dict of FFI target name -> {platform: PyCapsule of the handler}.");
  m.def("built_with_cuda", [] { return fp8kit_built_with_cuda() != 0; },
        "True when this build contains the CUDA kernels and handlers.");
  m.def("version", [] { return std::string(fp8kit_version()); });
  m.def(
      "supports_non_tn_fp8_gemm",
      [](const std::string& platform, int index) {
        int supported = 0;
        Check(fp8kit_supports_non_tn_fp8_gemm(DeviceType(platform), index, &supported));
        return supported != 0;
      },
      py::arg("platform"), py::arg("index"),
      "The core's cached answer: can FP8 GEMMs on this device read operands in "
      "non-TN layouts? (False on CPU, Ada and Hopper.)");
  m.def("cuda_device_count", [] { return fp8kit_cuda_device_count(); });
  m.def(
      "gemm_workspace_size",
      [](const std::string& platform) {
        return fp8kit_gemm_workspace_size(DeviceType(platform));
      },
      py::arg("platform"),
      "Bytes of cuBLASLt workspace the GEMM custom call asks XLA for (0 on CPU).");
  // The C enum values of the dtypes that travel as FFI attributes.
  py::dict codes;
  codes["e4m3"] = static_cast<int>(FP8KIT_E4M3);
  codes["e5m2"] = static_cast<int>(FP8KIT_E5M2);
  m.attr("FP8_DTYPE_CODES") = codes;
  m.def(
      "fp8_max",
      [](const std::string& name) {
        if (name == "e4m3") return fp8kit_fp8_max(FP8KIT_E4M3);
        if (name == "e5m2") return fp8kit_fp8_max(FP8KIT_E5M2);
        throw py::value_error("fp8kit: unknown FP8 format '" + name + "'; use 'e4m3' or 'e5m2'");
      },
      py::arg("fp8_dtype"));
}
