// fp8kit._jax_ext: exports the XLA FFI handlers as PyCapsules, plus the
// core's answers and constants the Python layer needs at trace time
// (capability, workspace size, dtype and reduction codes, FP8 limits).
// fp8kit/jax/_ffi.py registers every capsule with jax.ffi.register_ffi_target
// on import.
#include <pybind11/pybind11.h>

#include <pybind11/stl.h>

#include <string>
#include <tuple>
#include <vector>

#include "fp8kit/fp8kit.h"
#include "fp8kit/grouped.h"
#include "fp8kit/linear.h"
#include "handlers.h"
#include "scratch.h"

namespace py = pybind11;

namespace fp8kit_jax {

// A function-local static: FP8KIT_JAX_HANDLER registers during static
// initialization of other translation units, in an unspecified order.
static std::vector<HandlerEntry>& Registry() {
  static std::vector<HandlerEntry> entries;
  return entries;
}

bool RegisterHandler(const char* target, void* cpu, void* cuda) {
  Registry().push_back(HandlerEntry{target, cpu, cuda});
  return true;
}

const std::vector<HandlerEntry>& Handlers() { return Registry(); }

}  // namespace fp8kit_jax

namespace {

// {target name: {"cpu": capsule, "CUDA": capsule}} (no "CUDA" key in a
// CPU-only build).
py::dict Registrations() {
  py::dict out;
  for (const fp8kit_jax::HandlerEntry& t : fp8kit_jax::Handlers()) {
    py::dict platforms;
    platforms["cpu"] = py::capsule(t.cpu);
    if (t.cuda != nullptr) platforms["CUDA"] = py::capsule(t.cuda);
    out[t.target] = platforms;
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

fp8kit_weight_layout WeightLayout(const std::string& name) {
  if (name == "out_in") return FP8KIT_WEIGHT_OUT_IN;
  if (name == "in_out") return FP8KIT_WEIGHT_IN_OUT;
  throw py::value_error("fp8kit: weight_layout '" + name +
                        "' is not 'out_in' ([N, K]) or 'in_out' ([K, N])");
}

py::tuple Copies(const fp8kit_copies& c) {
  return py::make_tuple(c.rowwise != 0, c.columnwise != 0);
}

// fp8kit_linear_plan_make as a dict of (rowwise, columnwise) pairs; the
// slots of "quantize" are in fp8kit_linear_slot order (x, weight, dy).
py::dict LinearPlan(int64_t tokens, int64_t in_features, int64_t out_features,
                    const std::string& weight_layout, bool dgrad, bool wgrad, bool non_tn) {
  fp8kit_linear_plan plan;
  Check(fp8kit_linear_plan_make(tokens, in_features, out_features, WeightLayout(weight_layout),
                                dgrad ? 1 : 0, wgrad ? 1 : 0, non_tn ? 1 : 0, &plan));
  py::dict out;
  out["quantize"] = py::make_tuple(Copies(plan.quantize[FP8KIT_SLOT_INPUT]),
                                   Copies(plan.quantize[FP8KIT_SLOT_WEIGHT]),
                                   Copies(plan.quantize[FP8KIT_SLOT_GRAD_OUTPUT]));
  out["saved_input"] = Copies(plan.saved_input);
  out["saved_weight"] = Copies(plan.saved_weight);
  out["wgrad_columnwise"] = plan.wgrad_columnwise != 0;
  out["wgrad_inner"] = plan.wgrad_inner;
  return out;
}

// fp8kit_block_scale_inv_shape for a tensor of `shape`: (outer, inner) of
// the block scales of its rowwise or columnwise copy.
py::tuple BlockScaleInvShape(int scaling_mode, const std::vector<int64_t>& shape,
                             bool columnwise) {
  if (shape.size() > FP8KIT_MAX_RANK) {
    throw py::value_error("fp8kit: block_scale_inv_shape takes ranks up to " +
                          std::to_string(FP8KIT_MAX_RANK));
  }
  fp8kit_tensor t = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_E4M3,
                                       static_cast<int>(shape.size()), shape.data(), nullptr);
  t.scaling_mode = static_cast<fp8kit_scaling_mode>(scaling_mode);
  int64_t out[2] = {0, 0};
  Check(fp8kit_block_scale_inv_shape(&t, columnwise ? 1 : 0, out));
  return py::make_tuple(out[0], out[1]);
}

// Bytes of the workspace result of a quantize call (jax_ext/scratch.h):
// one (rows, cols, sums) per input; with_state for the fused delayed call.
size_t WorkspaceBytes(const std::vector<std::tuple<int64_t, int64_t, bool>>& tensors,
                      bool with_state) {
  std::vector<fp8kit_jax::ScratchTensor> scratch;
  for (const auto& [rows, cols, sums] : tensors) scratch.push_back({rows, cols, sums});
  return fp8kit_jax::ScratchLayout(scratch, with_state).bytes();
}

}  // namespace

PYBIND11_MODULE(_jax_ext, m) {
  m.doc() = "fp8kit's XLA FFI handlers (PyCapsules) and core queries for fp8kit.jax";
  m.def("registrations", &Registrations,
        "Dict of FFI target name -> {platform: PyCapsule of the handler}.");
  m.def("built_with_cuda", [] { return fp8kit_built_with_cuda() != 0; },
        "True when this build contains the CUDA kernels and handlers.");
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
  m.def(
      "supports_block_scaled_fp8_gemm",
      [](const std::string& platform, int index) {
        int supported = 0;
        Check(fp8kit_supports_block_scaled_fp8_gemm(DeviceType(platform), index, &supported));
        return supported != 0;
      },
      py::arg("platform"), py::arg("index"),
      "The core's cached answer: does this device run block-scaled FP8 GEMMs? (True on the "
      "CPU reference and on Hopper with cuBLASLt 12.9+.)");
  m.def("block_scale_inv_shape", &BlockScaleInvShape, py::arg("scaling_mode"), py::arg("shape"),
        py::arg("columnwise"),
        "fp8kit_block_scale_inv_shape: (outer, inner) of the float32 block scales of the "
        "rowwise or columnwise copy of a tensor of `shape` (fp8kit/block_scaling.h).");
  m.def(
      "gemm_workspace_size",
      [](const std::string& platform) {
        return fp8kit_gemm_workspace_size(DeviceType(platform));
      },
      py::arg("platform"),
      "Bytes of cuBLASLt workspace the GEMM custom call asks XLA for (0 on CPU).");
  m.def("linear_plan", &LinearPlan, py::arg("tokens"), py::arg("in_features"),
        py::arg("out_features"), py::arg("weight_layout"), py::arg("dgrad"), py::arg("wgrad"),
        py::arg("non_tn"),
        "fp8kit_linear_plan_make: which copies of x, weight and dy a Linear call quantizes and "
        "keeps (fp8kit/linear.h). weight_layout: 'out_in' ([N, K]) or 'in_out' ([K, N]).");
  m.def("workspace_bytes", &WorkspaceBytes, py::arg("tensors"), py::arg("with_state"),
        "Bytes of the uint8 workspace result of a quantize custom call: tensors lists "
        "(rows, cols, column_sums) of each input's 2-D view; with_state for "
        "fp8kit_quantize_delayed_update.");
  m.def("norm_backward_workspace", &fp8kit_norm_backward_workspace, py::arg("rows"),
        py::arg("hidden"),
        "Floats of workspace fp8kit_norm_backward needs for x [rows, hidden] (the "
        "fp8kit_norm_backward custom call's workspace result).");
  // The C enum values that travel as FFI attributes.
  py::dict dtype_codes;
  dtype_codes["e4m3"] = static_cast<int>(FP8KIT_E4M3);
  dtype_codes["e5m2"] = static_cast<int>(FP8KIT_E5M2);
  m.attr("FP8_DTYPE_CODES") = dtype_codes;
  py::dict reduction_codes;  // keys: fp8kit.recipe.AmaxReduction values
  reduction_codes["max"] = static_cast<int>(FP8KIT_AMAX_MAX);
  reduction_codes["most_recent"] = static_cast<int>(FP8KIT_AMAX_MOST_RECENT);
  m.attr("AMAX_REDUCTION_CODES") = reduction_codes;
  py::dict scaling_mode_codes;  // the names fp8kit.jax uses for fp8kit_scaling_mode
  scaling_mode_codes["per_tensor"] = static_cast<int>(FP8KIT_SCALING_PER_TENSOR);
  scaling_mode_codes["block_1x128"] = static_cast<int>(FP8KIT_SCALING_BLOCK_1X128);
  scaling_mode_codes["block_128x128"] = static_cast<int>(FP8KIT_SCALING_BLOCK_128X128);
  m.attr("SCALING_MODE_CODES") = scaling_mode_codes;
  // Elements along a block side (1 x BLOCK_LEN tiles, BLOCK_LEN^2 blocks).
  m.attr("BLOCK_LEN") = FP8KIT_BLOCK_LEN;
  // The largest finite value of each FP8 format (the core's fp8kit_fp8_max).
  py::dict fp8_max;
  fp8_max["e4m3"] = fp8kit_fp8_max(FP8KIT_E4M3);
  fp8_max["e5m2"] = fp8kit_fp8_max(FP8KIT_E5M2);
  m.attr("FP8_MAX") = fp8_max;
  // K, N and every FP8 GEMM's inner dimension are multiples of this.
  m.attr("GEMM_DIM_MULTIPLE") = FP8KIT_GEMM_DIM_MULTIPLE;
  // Each row of a GEMM's output is a multiple of this many bytes; a
  // block-scaled GEMM's N (and M for a 1x128 A) a multiple of the next.
  m.attr("GEMM_ROW_BYTES_MULTIPLE") = FP8KIT_GEMM_ROW_BYTES_MULTIPLE;
  m.attr("BLOCK_GEMM_MN_MULTIPLE") = FP8KIT_BLOCK_GEMM_MN_MULTIPLE;
  // Block scale arrays pad their inner dimension to a multiple of this.
  m.attr("BLOCK_SCALE_INNER_MULTIPLE") = FP8KIT_BLOCK_SCALE_INNER_MULTIPLE;
  m.attr("CAST_STATISTICS_WORKSPACE_BYTES") = FP8KIT_CAST_STATISTICS_WORKSPACE_BYTES;
  // Floats from one group's scale to the next in a grouped op's per-group
  // scales (fp8kit/grouped.h).
  m.attr("GROUP_SCALE_STRIDE") = FP8KIT_GROUP_SCALE_STRIDE;
  m.attr("MAX_GROUPS") = FP8KIT_MAX_GROUPS;
  m.def("grouped_columnwise_tokens", &fp8kit_grouped_columnwise_tokens, py::arg("tokens"),
        py::arg("groups"),
        "fp8kit_grouped_columnwise_tokens: the token capacity (columns per feature) of the "
        "grouped columnwise copy of `tokens` rows in `groups` groups.");
  m.def(
      "grouped_block_scales_floats",
      [](int64_t rows, int64_t groups, int64_t features, int scaling_mode, bool columnwise) {
        return fp8kit_grouped_block_scales_floats(
            rows, groups, features, static_cast<fp8kit_scaling_mode>(scaling_mode),
            columnwise ? 1 : 0);
      },
      py::arg("rows"), py::arg("groups"), py::arg("features"), py::arg("scaling_mode"),
      py::arg("columnwise"),
      "fp8kit_grouped_block_scales_floats: the floats of one copy's block scales of a padded "
      "grouped tensor of `rows` rows (scaling_mode: a SCALING_MODE_CODES value).");
  // The slots of a Linear's scaling state (fp8kit_linear_slot).
  m.attr("SLOT_INPUT") = int(FP8KIT_SLOT_INPUT);
  m.attr("SLOT_WEIGHT") = int(FP8KIT_SLOT_WEIGHT);
  m.attr("SLOT_GRAD_OUTPUT") = int(FP8KIT_SLOT_GRAD_OUTPUT);
  m.attr("NUM_SLOTS") = int(FP8KIT_NUM_SLOTS);
  // The delayed-scaling recipe ranges (fp8kit/delayed_scaling.h), which
  // fp8kit.recipe states too: margin in [0, MARGIN_MAX], history length in
  // [1, AMAX_HISTORY_LEN_MAX].
  m.attr("MARGIN_MAX") = FP8KIT_MARGIN_MAX;
  m.attr("AMAX_HISTORY_LEN_MAX") = FP8KIT_AMAX_HISTORY_LEN_MAX;
}
