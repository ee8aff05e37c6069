/* fp8kit's C API from C: quantize to E4M3 with a given scale, dequantize,
 * a refused call with its error message, and a byte copy and fill.
 * Compiled as C with this workspace's default flags: the public headers
 * need no C++ and no flag from fp8kit. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "fp8kit/fp8kit.h"

static int failures = 0;

#define CHECK(cond)                                                  \
  do {                                                               \
    if (!(cond)) {                                                   \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      failures++;                                                    \
    }                                                                \
  } while (0)

int main(void) {
  printf("fp8kit %s, CUDA: %d\n", fp8kit_version(), fp8kit_built_with_cuda());
  CHECK(fp8kit_fp8_max(FP8KIT_E4M3) == 448.0f);
  CHECK(fp8kit_fp8_max(FP8KIT_E5M2) == 57344.0f);

  /* x * 2 rounds to nearest even in E4M3 (3 mantissa bits) and saturates
   * at 448: 0.5*2 = 1 (0x38), -1.25*2 = -2.5 (0xC2), 0.3*2 = 0.6 -> 0.625
   * (0x32), 300*2 = 600 -> 448 (0x7E). */
  float x[4] = {0.5f, -1.25f, 0.3f, 300.0f};
  const uint8_t expected_bits[4] = {0x38, 0xC2, 0x32, 0x7E};
  const float expected_back[4] = {0.5f, -1.25f, 0.3125f, 224.0f};
  int64_t shape[2] = {2, 2};
  uint8_t q[4] = {0};
  float scale = 2.0f, scale_inv = 0.0f, amax = 0.0f;

  fp8kit_tensor input = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_FLOAT32, 2, shape, x);
  fp8kit_tensor output = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_E4M3, 2, shape, q);
  output.scaling_mode = FP8KIT_SCALING_PER_TENSOR;
  output.scale = &scale;
  output.scale_inv = &scale_inv;
  output.amax = &amax;
  fp8kit_status status = fp8kit_quantize(&input, &output, NULL);
  CHECK(status == FP8KIT_OK);
  if (status != FP8KIT_OK) fprintf(stderr, "fp8kit_quantize: %s\n", fp8kit_last_error());
  CHECK(memcmp(q, expected_bits, sizeof(q)) == 0);
  CHECK(scale_inv == 0.5f);
  CHECK(amax == 300.0f);

  float back[4] = {0};
  fp8kit_tensor restored = fp8kit_tensor_make(FP8KIT_DEVICE_CPU, 0, FP8KIT_FLOAT32, 2, shape, back);
  status = fp8kit_dequantize(&output, &restored, 0, NULL);
  CHECK(status == FP8KIT_OK);
  for (int i = 0; i < 4; ++i) CHECK(back[i] == expected_back[i]);

  /* No scale: refused with a status and a message, not a crash. */
  output.scale = NULL;
  status = fp8kit_quantize(&input, &output, NULL);
  CHECK(status == FP8KIT_INVALID_ARGUMENT);
  CHECK(strlen(fp8kit_last_error()) > 0);
  printf("refused as expected: %s\n", fp8kit_last_error());

  /* Byte copy and fill (fp8kit/memory.h); a NULL destination is refused. */
  uint8_t bytes[4] = {0};
  CHECK(fp8kit_copy_bytes(FP8KIT_DEVICE_CPU, 0, bytes, expected_bits, 4, NULL) == FP8KIT_OK);
  CHECK(memcmp(bytes, expected_bits, 4) == 0);
  CHECK(fp8kit_zero_bytes(FP8KIT_DEVICE_CPU, 0, bytes, 2, NULL) == FP8KIT_OK);
  CHECK(bytes[0] == 0 && bytes[1] == 0 && bytes[2] == expected_bits[2]);
  CHECK(fp8kit_copy_bytes(FP8KIT_DEVICE_CPU, 0, NULL, bytes, 4, NULL) == FP8KIT_INVALID_ARGUMENT);

  if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
  return failures ? 1 : 0;
}
