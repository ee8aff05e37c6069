// The seam between the dispatching C API (common/src) and the CUDA
// implementation (common/cuda). Only compiled in when FP8KIT_WITH_CUDA is
// defined. Inputs reaching these functions are already validated by the
// same checks the CPU path runs; they throw fp8kit::Error on CUDA or
// cuBLASLt failures.
#ifndef FP8KIT_SRC_CUDA_BACKEND_H_
#define FP8KIT_SRC_CUDA_BACKEND_H_

#include <cstddef>
#include <string>
#include <vector>

#include "fp8kit/activation.h"
#include "fp8kit/delayed_scaling.h"
#include "fp8kit/fused_cast.h"
#include "fp8kit/gemm.h"
#include "fp8kit/grouped.h"
#include "fp8kit/normalization.h"
#include "fp8kit/quantize.h"
#include "fp8kit/statistics.h"
#include "fp8kit/tensor.h"
#include "gemm_problem.h"
#include "grouped_layout.h"

namespace fp8kit {
namespace cuda {

// Device queries (common/cuda/device.cu).
int device_count();
int compute_capability(int device_index);
bool supports_non_tn_fp8_gemm(int device_index);
// Empty when the device runs block-scaled FP8 GEMMs; otherwise what it
// lacks, e.g. "CUDA device 0 has compute capability 10.0".
const std::string& block_scaled_fp8_gemm_missing(int device_index);

// Asynchronous copy and fill on `stream`, a cudaStream_t (common/cuda/memory.cc).
void copy_bytes(int device_index, void* dst, const void* src, size_t bytes, void* stream);
void zero_bytes(int device_index, void* dst, size_t bytes, void* stream);
// Device to host, then a wait for `stream` (the copy is needed on the host
// at once).
void copy_to_host(int device_index, void* dst, const void* src, size_t bytes, void* stream);

// Kernels (common/cuda/*.cu). `stream` is a cudaStream_t.
void amax(const fp8kit_tensor& input, float* amax_out, void* stream);
void quantize(const fp8kit_tensor& input, fp8kit_tensor& output, void* stream);
// `sums`: NULL or column sums to write (validated).
void quantize_current_scaling(const fp8kit_tensor& input, fp8kit_tensor& output,
                              const fp8kit_current_scaling_config& config,
                              const fp8kit_column_sums* sums, void* stream);
// `sums`: NULL or `count` entries (entries with a NULL `sums` field skip).
void quantize_current_scaling_many(const fp8kit_tensor* inputs, fp8kit_tensor* outputs,
                                   const fp8kit_column_sums* sums, int count,
                                   const fp8kit_current_scaling_config& config, void* stream);
void quantize_block_scaling(const fp8kit_tensor& input, fp8kit_tensor& output,
                            const fp8kit_current_scaling_config& config, void* stream);
// Each group of a padded grouped tensor (fp8kit/grouped.h) as
// quantize_block_scaling quantizes it alone, in one launch; row_scales /
// col_scales: where each group's scales start (block_scale_offsets).
void grouped_quantize_block_scaling(const fp8kit_tensor& input, const GroupLayout& layout,
                                    const std::vector<int64_t>& row_scales,
                                    const std::vector<int64_t>& col_scales,
                                    fp8kit_tensor& output,
                                    const fp8kit_current_scaling_config& config, void* stream);
void compute_scale(const float* amax, float* scale, float* scale_inv, float fp8_max,
                   const fp8kit_current_scaling_config& config, int device_index, void* stream);
void dequantize(const fp8kit_tensor& input, fp8kit_tensor& output, bool from_columnwise,
                void* stream);
void columnwise_from_rowwise(fp8kit_tensor& tensor, void* stream);
void delayed_scaling_update(const fp8kit_delayed_scaling_state* states, int count,
                            const fp8kit_delayed_scaling_config& config, int device_index,
                            void* stream);
// `sums`: NULL or `count` entries (entries with a NULL `sums` field skip).
void quantize_delayed_update(const fp8kit_tensor* inputs, fp8kit_tensor* outputs,
                             const fp8kit_delayed_quantize_state* states,
                             const fp8kit_column_sums* sums, int count,
                             const fp8kit_delayed_scaling_config& config, bool record,
                             void* stream);

// Fused ops (common/cuda/norm_*.cu, activation.cu); absent optional
// tensors are NULL.
void norm_forward(const fp8kit_norm_config& config, const fp8kit_tensor& x,
                  const fp8kit_tensor& gamma, const fp8kit_tensor* beta, fp8kit_tensor* y,
                  fp8kit_tensor* y_fp8, const fp8kit_fused_cast* cast, fp8kit_tensor* mean,
                  fp8kit_tensor& rsigma, void* stream);
void norm_backward(const fp8kit_norm_config& config, const fp8kit_tensor& dy,
                   const fp8kit_tensor& x, const fp8kit_tensor* mean, const fp8kit_tensor& rsigma,
                   const fp8kit_tensor& gamma, fp8kit_tensor& dx, fp8kit_tensor& dgamma,
                   fp8kit_tensor* dbeta, float* workspace, void* stream);
void activation_forward(fp8kit_activation act, const fp8kit_tensor& h, fp8kit_tensor* a,
                        fp8kit_tensor* a_fp8, const fp8kit_fused_cast* cast, void* stream);
void activation_backward(fp8kit_activation act, const fp8kit_tensor& d_a, const fp8kit_tensor& h,
                         fp8kit_tensor* dh, fp8kit_tensor* dh_fp8, const fp8kit_fused_cast* cast,
                         const fp8kit_column_sums* sums, void* stream);

// Per-group quantization of a token-grouped tensor (common/cuda/
// grouped_quantize.cu); `current` NULL casts with the given scales.
void grouped_quantize(const fp8kit_tensor& input, const GroupLayout& layout, fp8kit_tensor& output,
                      const fp8kit_current_scaling_config* current, void* stream);
// The same with a delayed-scaling state per group (validated).
void grouped_quantize_delayed_update(const fp8kit_tensor& input, const GroupLayout& layout,
                                     fp8kit_tensor& output,
                                     const fp8kit_grouped_delayed_state& state,
                                     const fp8kit_delayed_scaling_config& config, bool record,
                                     void* stream);

// Statistics of a cast (common/cuda/cast_statistics.cu); row_scale_inv as
// cast_statistics_cpu's, a device pointer.
void cast_statistics(const fp8kit_tensor& input, const fp8kit_tensor& quantized,
                     bool from_columnwise, const float* row_scale_inv,
                     const fp8kit_cast_statistics& out, void* stream);

// cuBLASLt GEMM (common/cuda/gemm_cublaslt.cc). Takes the problem that
// make_gemm_problem (common/src/gemm_problem.h) validated and canonicalized.
void gemm(const GemmProblem& problem, void* stream);
size_t gemm_workspace_size();

}  // namespace cuda
}  // namespace fp8kit

#endif  // FP8KIT_SRC_CUDA_BACKEND_H_
