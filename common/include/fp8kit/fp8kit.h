/* The whole fp8kit C API. */
#ifndef FP8KIT_FP8KIT_H_
#define FP8KIT_FP8KIT_H_

#include "fp8kit/activation.h"
#include "fp8kit/amax.h"
#include "fp8kit/block_scaling.h"
#include "fp8kit/column_sums.h"
#include "fp8kit/delayed_scaling.h"
#include "fp8kit/device.h"
#include "fp8kit/fused_cast.h"
#include "fp8kit/gemm.h"
#include "fp8kit/grouped.h"
#include "fp8kit/linear.h"
#include "fp8kit/memory.h"
#include "fp8kit/normalization.h"
#include "fp8kit/quantize.h"
#include "fp8kit/statistics.h"
#include "fp8kit/status.h"
#include "fp8kit/tensor.h"

#endif  /* FP8KIT_FP8KIT_H_ */
