#include "linear_recipe.h"

#include <string>

#include "descriptors.h"
#include "errors.h"
#include "py_values.h"

namespace py = pybind11;

namespace fp8kit_torch {
namespace {

constexpr const char* kRecipeFn = "fp8kit.torch.Linear";

// fp8kit.recipe's classes, looked up once.
struct RecipeTypes {
  py::object delayed, current, format, amax_reduction;
};

const RecipeTypes& recipe_types() {
  PYBIND11_CONSTINIT static py::gil_safe_call_once_and_store<RecipeTypes> storage;
  return storage
      .call_once_and_store_result([] {
        py::module_ m = py::module_::import("fp8kit.recipe");
        return RecipeTypes{m.attr("DelayedScaling"), m.attr("CurrentScaling"),
                           m.attr("Format"), m.attr("AmaxReduction")};
      })
      .get_stored();
}

bool is_instance(py::handle v, const py::object& cls) {
  const int r = PyObject_IsInstance(v.ptr(), cls.ptr());
  if (r < 0) throw py::error_already_set();
  return r == 1;
}

}  // namespace

LinearRecipe recipe_from_python(py::handle recipe, bool* fast_accumulation) {
  const RecipeTypes& t = recipe_types();
  LinearRecipe r;
  r.delayed = is_instance(recipe, t.delayed);
  FP8KIT_TYPE_CHECK(r.delayed || is_instance(recipe, t.current), kRecipeFn, ": recipe is ",
                    value_str(recipe),
                    "; use fp8kit.recipe.DelayedScaling or fp8kit.recipe.CurrentScaling");
  auto where = [](const char* field) { return c10::str(kRecipeFn, ": recipe.", field); };
  const py::object fmt = recipe.attr("fp8_format");
  FP8KIT_TYPE_CHECK(is_instance(fmt, t.format), where("fp8_format"), " is ", value_str(fmt),
                    "; it must be an fp8kit.recipe.Format");
  r.forward_dtype = parse_fp8_name(fmt.attr("forward_dtype").cast<std::string>(), kRecipeFn,
                                   "recipe.fp8_format.forward_dtype");
  r.backward_dtype = parse_fp8_name(fmt.attr("backward_dtype").cast<std::string>(), kRecipeFn,
                                    "recipe.fp8_format.backward_dtype");
  const bool fast =
      read_bool(recipe.attr("forward_fast_accumulation"), where("forward_fast_accumulation"));
  if (fast_accumulation) *fast_accumulation = fast;
  if (r.delayed) {
    r.amax_history_len =
        read_int(recipe.attr("amax_history_len"), where("amax_history_len"), 1,
                 FP8KIT_AMAX_HISTORY_LEN_MAX);
    r.margin = read_int(recipe.attr("margin"), where("margin"), 0, FP8KIT_MARGIN_MAX);
    const py::object red = recipe.attr("amax_reduction");
    FP8KIT_TYPE_CHECK(is_instance(red, t.amax_reduction), where("amax_reduction"), " is ",
                      value_str(red), "; it must be an fp8kit.recipe.AmaxReduction");
    r.amax_reduction = parse_amax_reduction(red.attr("value").cast<std::string>(), kRecipeFn,
                                            "recipe.amax_reduction");
  } else {
    r.amax_epsilon =
        static_cast<float>(read_epsilon(recipe.attr("amax_epsilon"), where("amax_epsilon")));
    r.power_2_scale = read_bool(recipe.attr("power_2_scale"), where("power_2_scale"));
  }
  return r;
}

py::dict recipe_to_plain(const LinearRecipe& r) {
  py::dict d;
  d["scaling"] = r.delayed ? "delayed" : "current";
  d["forward_dtype"] = fp8_name(r.forward_dtype);
  d["backward_dtype"] = fp8_name(r.backward_dtype);
  if (r.delayed) {
    d["amax_history_len"] = r.amax_history_len;
    d["margin"] = r.margin;
    d["amax_reduction"] = amax_reduction_name(r.amax_reduction);
  } else {
    d["amax_epsilon"] = static_cast<double>(r.amax_epsilon);
    d["power_2_scale"] = r.power_2_scale;
  }
  return d;
}

LinearRecipe recipe_from_plain(py::handle saved, const std::string& where_saved) {
  const char* fn = where_saved.c_str();
  FP8KIT_TYPE_CHECK(PyDict_Check(saved.ptr()), fn, ": the saved 'recipe' is ", value_str(saved),
                    "; it must be a dict");
  const py::dict d = py::reinterpret_borrow<py::dict>(saved);
  auto get = [&](const char* key) {
    FP8KIT_VALUE_CHECK(d.contains(key), fn, ": the saved recipe has no '", key, "'");
    return py::object(d[key]);
  };
  auto where = [&](const char* key) { return c10::str(fn, ": the saved recipe's '", key, "'"); };
  LinearRecipe r;
  const std::string scaling = read_str(get("scaling"), where("scaling"));
  FP8KIT_VALUE_CHECK(scaling == "delayed" || scaling == "current", where("scaling"), " is '",
                     scaling, "'; it must be 'delayed' or 'current'");
  r.delayed = scaling == "delayed";
  // Files written before the formats took the recipe's names call them
  // 'fwd_dtype' and 'bwd_dtype'.
  auto format = [&](const char* key, const char* old_key) {
    const char* k = d.contains(key) || !d.contains(old_key) ? key : old_key;
    const std::string arg = c10::str("the saved recipe's '", k, "'");
    return parse_fp8_name(read_str(get(k), where(k)), fn, arg.c_str());
  };
  r.forward_dtype = format("forward_dtype", "fwd_dtype");
  r.backward_dtype = format("backward_dtype", "bwd_dtype");
  if (r.delayed) {
    r.amax_history_len = read_int(get("amax_history_len"), where("amax_history_len"), 1,
                             FP8KIT_AMAX_HISTORY_LEN_MAX);
    r.margin = read_int(get("margin"), where("margin"), 0, FP8KIT_MARGIN_MAX);
    r.amax_reduction =
        parse_amax_reduction(read_str(get("amax_reduction"), where("amax_reduction")), fn,
                             "the saved recipe's 'amax_reduction'");
  } else {
    r.amax_epsilon = static_cast<float>(read_epsilon(get("amax_epsilon"), where("amax_epsilon")));
    r.power_2_scale = read_bool(get("power_2_scale"), where("power_2_scale"));
  }
  return r;
}

}  // namespace fp8kit_torch
