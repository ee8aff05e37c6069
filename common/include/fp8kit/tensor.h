/* The tensor descriptor: a plain struct every fp8kit op takes by pointer.
 *
 * A descriptor does not own memory. Data is dense and row-major ("C
 * contiguous"); strided views must be made contiguous by the caller. All
 * pointers of one descriptor live on the same device as `data`.
 *
 * Scale convention (the only place it is written down for the C API):
 *   q = saturate(round_to_nearest_even(x * scale))   in the FP8 format
 *   x ~= q * scale_inv,  scale_inv = 1 / scale
 * saturate applies to finite x: +-inf and NaN stay non-finite (E4M3, which
 * has no inf, makes +-inf NaN; fp8kit/quantize.h).
 * GEMMs read scale_inv (dequantization factors); quantizers read scale.
 * Block-scaled tensors (fp8kit/block_scaling.h) follow the same convention
 * with one scale per block, and keep only the scale_inv of each block. */
#ifndef FP8KIT_TENSOR_H_
#define FP8KIT_TENSOR_H_

#include <stddef.h>
#include <stdint.h>

#include "fp8kit/export.h"
#include "fp8kit/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FP8KIT_MAX_RANK 8

typedef enum fp8kit_device_type {
  FP8KIT_DEVICE_CPU = 0,
  FP8KIT_DEVICE_CUDA = 1
} fp8kit_device_type;

typedef enum fp8kit_dtype {
  FP8KIT_FLOAT32 = 0,
  FP8KIT_BFLOAT16 = 1,
  FP8KIT_FLOAT16 = 2,
  FP8KIT_E4M3 = 3, /* float8_e4m3fn: no inf, max 448 */
  FP8KIT_E5M2 = 4, /* float8_e5m2: IEEE-like, max 57344 */
  FP8KIT_INT64 = 5 /* counts (the group sizes of fp8kit/grouped.h), never a value */
} fp8kit_dtype;

/* How the scale fields are to be read. Values 4 and up are kept for the
 * Blackwell formats (MXFP8, NVFP4). */
typedef enum fp8kit_scaling_mode {
  FP8KIT_SCALING_NONE = 0,          /* high-precision tensor, no scales */
  FP8KIT_SCALING_PER_TENSOR = 1,    /* one float scale / scale_inv (delayed and current) */
  FP8KIT_SCALING_BLOCK_1X128 = 2,   /* one scale per 1x128 tile of each stored copy */
  FP8KIT_SCALING_BLOCK_128X128 = 3  /* one scale per 128x128 block */
} fp8kit_scaling_mode;

typedef struct fp8kit_tensor {
  fp8kit_device_type device_type;
  int device_index;                 /* CUDA ordinal; 0 on CPU */
  fp8kit_dtype dtype;               /* element type of data and columnwise_data */
  int rank;                         /* 0..FP8KIT_MAX_RANK */
  int64_t shape[FP8KIT_MAX_RANK];   /* logical shape of `data` */
  void* data;                       /* rowwise data, row-major, may be NULL if only columnwise is held */
  fp8kit_scaling_mode scaling_mode;
  /* Columnwise (transposed) data: the tensor flattened to 2D as
   * [prod(shape[:-1]), shape[-1]] and stored transposed, i.e. row-major
   * [shape[-1], prod(shape[:-1])]. NULL when not held. */
  void* columnwise_data;
  float* scale;       /* per-tensor quantization scale (1 float) or NULL */
  float* scale_inv;   /* per-tensor dequantization factor (1 float) or NULL */
  float* amax;        /* max |x| of the high-precision source (1 float) or NULL */
  /* Block scaling only (scaling_mode BLOCK_1X128 or BLOCK_128X128; NULL
   * otherwise): the scale_inv of every block of `data` and of
   * `columnwise_data`, float32, each in the layout cuBLASLt reads (shape:
   * fp8kit_block_scale_inv_shape; rule and layout: fp8kit/block_scaling.h).
   * Each is needed exactly when its data is. */
  float* block_scale_inv;
  float* columnwise_block_scale_inv;
} fp8kit_tensor;

/* A descriptor with every field zero/NULL except the ones given. */
FP8KIT_API fp8kit_tensor fp8kit_tensor_make(fp8kit_device_type device_type, int device_index,
                                            fp8kit_dtype dtype, int rank, const int64_t* shape,
                                            void* data);

/* Number of elements (1 for rank 0). */
FP8KIT_API int64_t fp8kit_tensor_numel(const fp8kit_tensor* t);

/* Bytes of one element of `dtype`. */
FP8KIT_API size_t fp8kit_dtype_size(fp8kit_dtype dtype);

/* Name of a dtype, e.g. "e4m3". */
FP8KIT_API const char* fp8kit_dtype_name(fp8kit_dtype dtype);

/* Largest finite value of an FP8 format (448 for E4M3, 57344 for E5M2); 0
 * for other dtypes. */
FP8KIT_API float fp8kit_fp8_max(fp8kit_dtype dtype);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* FP8KIT_TENSOR_H_ */
