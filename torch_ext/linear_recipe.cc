#include "linear_recipe.h"

#include <cmath>
#include <string>

#include "descriptors.h"
#include "errors.h"

namespace py = pybind11;

namespace fp8kit_torch {
namespace {

constexpr const char* kFn = "fp8kit.torch.Linear";
constexpr int kMaxHistoryLen = 1 << 20;
constexpr int kMaxMargin = 126;  // the core's bound: |margin| <= 126

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

// "'16' (str)": a value and its type, for messages.
std::string value_str(py::handle v) {
  return c10::str(py::repr(v).cast<std::string>(), " (", Py_TYPE(v.ptr())->tp_name, ")");
}

// Readers of one field. `where` names it ("fp8kit.torch.Linear: recipe.margin").
int read_int(py::handle v, const std::string& where, int lo, int hi) {
  FP8KIT_TYPE_CHECK(PyLong_Check(v.ptr()) && !PyBool_Check(v.ptr()), where, " is ", value_str(v),
                    "; it must be an int in [", lo, ", ", hi, "]");
  const long long x = v.cast<long long>();
  FP8KIT_VALUE_CHECK(x >= lo && x <= hi, where, " is ", x, "; it must be in [", lo, ", ", hi, "]");
  return static_cast<int>(x);
}

bool read_bool(py::handle v, const std::string& where) {
  FP8KIT_TYPE_CHECK(PyBool_Check(v.ptr()), where, " is ", value_str(v), "; it must be a bool");
  return v.ptr() == Py_True;
}

float read_epsilon(py::handle v, const std::string& where) {
  FP8KIT_TYPE_CHECK(PyFloat_Check(v.ptr()) || (PyLong_Check(v.ptr()) && !PyBool_Check(v.ptr())),
                    where, " is ", value_str(v), "; it must be a float >= 0");
  const double x = v.cast<double>();
  FP8KIT_VALUE_CHECK(std::isfinite(x) && x >= 0.0, where, " is ", x,
                     "; it must be a finite float >= 0 (0 disables it)");
  return static_cast<float>(x);
}

std::string read_str(py::handle v, const std::string& where) {
  FP8KIT_TYPE_CHECK(PyUnicode_Check(v.ptr()), where, " is ", value_str(v), "; it must be a str");
  return v.cast<std::string>();
}

}  // namespace

bool LinearRecipe::same_scaling(const LinearRecipe& o) const {
  if (delayed != o.delayed || fwd_fp8 != o.fwd_fp8 || bwd_fp8 != o.bwd_fp8) return false;
  if (delayed) {
    return history_len == o.history_len && margin == o.margin &&
           amax_reduction == o.amax_reduction;
  }
  return amax_epsilon == o.amax_epsilon && power_2_scale == o.power_2_scale;
}

LinearRecipe recipe_from_python(py::handle recipe) {
  const RecipeTypes& t = recipe_types();
  LinearRecipe r;
  r.delayed = is_instance(recipe, t.delayed);
  FP8KIT_TYPE_CHECK(r.delayed || is_instance(recipe, t.current), kFn, ": recipe is ",
                    value_str(recipe),
                    "; use fp8kit.recipe.DelayedScaling or fp8kit.recipe.CurrentScaling");
  auto where = [](const char* field) { return c10::str(kFn, ": recipe.", field); };
  const py::object fmt = recipe.attr("fp8_format");
  FP8KIT_TYPE_CHECK(is_instance(fmt, t.format), where("fp8_format"), " is ", value_str(fmt),
                    "; it must be an fp8kit.recipe.Format");
  r.fwd_fp8 = parse_fp8_name(fmt.attr("forward_dtype").cast<std::string>(), kFn,
                             "recipe.fp8_format.forward_dtype");
  r.bwd_fp8 = parse_fp8_name(fmt.attr("backward_dtype").cast<std::string>(), kFn,
                             "recipe.fp8_format.backward_dtype");
  r.forward_fast_accumulation =
      read_bool(recipe.attr("forward_fast_accumulation"), where("forward_fast_accumulation"));
  if (r.delayed) {
    r.history_len =
        read_int(recipe.attr("amax_history_len"), where("amax_history_len"), 1, kMaxHistoryLen);
    r.margin = read_int(recipe.attr("margin"), where("margin"), 0, kMaxMargin);
    const py::object red = recipe.attr("amax_reduction");
    FP8KIT_TYPE_CHECK(is_instance(red, t.amax_reduction), where("amax_reduction"), " is ",
                      value_str(red), "; it must be an fp8kit.recipe.AmaxReduction");
    r.amax_reduction = parse_amax_reduction(red.attr("value").cast<std::string>(), kFn,
                                            "recipe.amax_reduction");
  } else {
    r.amax_epsilon = read_epsilon(recipe.attr("amax_epsilon"), where("amax_epsilon"));
    r.power_2_scale = read_bool(recipe.attr("power_2_scale"), where("power_2_scale"));
  }
  return r;
}

py::dict recipe_to_plain(const LinearRecipe& r) {
  py::dict d;
  d["scaling"] = r.delayed ? "delayed" : "current";
  d["fwd_dtype"] = fp8_name(r.fwd_fp8);
  d["bwd_dtype"] = fp8_name(r.bwd_fp8);
  if (r.delayed) {
    d["amax_history_len"] = r.history_len;
    d["margin"] = r.margin;
    d["amax_reduction"] = amax_reduction_name(r.amax_reduction);
  } else {
    d["amax_epsilon"] = static_cast<double>(r.amax_epsilon);
    d["power_2_scale"] = r.power_2_scale;
  }
  return d;
}

LinearRecipe recipe_from_plain(py::handle saved) {
  constexpr const char* fn = "fp8kit.torch.Linear.set_extra_state";
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
  r.fwd_fp8 = parse_fp8_name(read_str(get("fwd_dtype"), where("fwd_dtype")), fn,
                             "the saved recipe's 'fwd_dtype'");
  r.bwd_fp8 = parse_fp8_name(read_str(get("bwd_dtype"), where("bwd_dtype")), fn,
                             "the saved recipe's 'bwd_dtype'");
  if (r.delayed) {
    r.history_len = read_int(get("amax_history_len"), where("amax_history_len"), 1, kMaxHistoryLen);
    r.margin = read_int(get("margin"), where("margin"), 0, kMaxMargin);
    r.amax_reduction =
        parse_amax_reduction(read_str(get("amax_reduction"), where("amax_reduction")), fn,
                             "the saved recipe's 'amax_reduction'");
  } else {
    r.amax_epsilon = read_epsilon(get("amax_epsilon"), where("amax_epsilon"));
    r.power_2_scale = read_bool(get("power_2_scale"), where("power_2_scale"));
  }
  return r;
}

}  // namespace fp8kit_torch
