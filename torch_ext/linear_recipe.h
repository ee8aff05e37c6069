// The scaling recipe of one Linear layer as C++ reads it: from an
// fp8kit.recipe object (DelayedScaling / CurrentScaling), field by field
// with type checks, and to and from the plain values a checkpoint stores.
#ifndef FP8KIT_TORCH_EXT_LINEAR_RECIPE_H_
#define FP8KIT_TORCH_EXT_LINEAR_RECIPE_H_

#include "torch_includes.h"

namespace fp8kit_torch {

struct LinearRecipe {
  bool delayed = true;  // DelayedScaling; false: CurrentScaling
  fp8kit_dtype forward_dtype = FP8KIT_E4M3;   // input and weight
  fp8kit_dtype backward_dtype = FP8KIT_E5M2;  // grad_output
  // Delayed scaling.
  int amax_history_len = 1;
  int margin = 0;
  fp8kit_amax_reduction amax_reduction = FP8KIT_AMAX_MAX;
  // Current scaling.
  float amax_epsilon = 0.0f;
  bool power_2_scale = false;
};

// Reads an fp8kit.recipe.DelayedScaling or CurrentScaling. TypeError /
// ValueError naming the field (e.g. "recipe.margin") for a value of the
// wrong type or out of range. The recipe's forward_fast_accumulation is not
// scaling state (one state serves recipes that differ only there; each
// call passes it to the forward GEMM): it goes to *fast_accumulation.
LinearRecipe recipe_from_python(pybind11::handle recipe, bool* fast_accumulation = nullptr);

// The recipe as plain Python values (str, int, float, bool) for a
// checkpoint, and back (with the same checks, naming the saved key after
// `where`, which names the checkpoint entry).
pybind11::dict recipe_to_plain(const LinearRecipe& r);
LinearRecipe recipe_from_plain(pybind11::handle saved, const std::string& where);

}  // namespace fp8kit_torch

#endif  // FP8KIT_TORCH_EXT_LINEAR_RECIPE_H_
