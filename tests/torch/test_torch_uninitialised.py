"""Every class the extension exports is safe when its __init__ was skipped
(C.__new__(C)) or raised: each method, property and repr raises a TypeError
that says how to construct the object, never a crash or garbage.

Each class runs in its own child process, so a crash fails one test
(naming the last case reached) instead of ending the run. The child lists
the class's methods and properties itself, so one added later is tested
too."""

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

_CHILD = textwrap.dedent("""
    import copy, json, pickle, sys
    import torch
    import fp8kit.torch as ft
    from fp8kit.torch._ext import ext

    cls = getattr(ext, sys.argv[1])
    x = torch.randn(16, 16)
    f8 = ft.Float8CurrentScalingQuantizer("e4m3")(x)
    # Arguments that would be valid for an initialised object.
    ARGS = {"__call__": (x,), "quantize": (x,), "update_quantized": (x, f8), "to": ("cpu",),
            "__deepcopy__": ({},), "set_usage": (True, True)}
    # pybind11's own entry points that take no instance of ours, or build one.
    SKIP = {"__init__", "__new__", "__setstate__", "_pybind11_conduit_v1_", "from_state"}

    def report(case, fn):
        print(json.dumps({"case": case, "start": True}), flush=True)
        try:
            fn()
            out = {"case": case, "error": None}
        except Exception as e:
            out = {"case": case, "error": type(e).__name__, "message": str(e)}
        print(json.dumps(out), flush=True)

    def cases():
        for klass in cls.__mro__:
            if klass.__module__ != "fp8kit._torch_ext":
                continue
            for name, attr in vars(klass).items():
                if name in SKIP or name.startswith("__") and name not in (
                        "__call__", "__repr__", "__deepcopy__", "__getstate__"):
                    continue
                if isinstance(attr, property):
                    yield "get " + name, lambda o, n=name: getattr(o, n)
                    if attr.fset is not None:
                        yield "set " + name, lambda o, n=name: setattr(o, n, False)
                elif callable(attr):
                    yield name, lambda o, n=name: getattr(o, n)(*ARGS.get(n, ()))
        yield "repr", repr
        yield "pickle", pickle.dumps
        yield "copy.copy", copy.copy
        yield "copy.deepcopy", copy.deepcopy
        if cls is ext.LinearState:
            yield "linear_forward", lambda o: ext.linear_forward(o, x, torch.randn(16, 16))

    for case, fn in cases():
        report(case, lambda: fn(cls.__new__(cls)))
    # One C++ method of the class, to probe the special cases below with.
    probe = (lambda o: o.get_state()) if cls is ext.LinearState else (lambda o: o(x))
    # An __init__ that raised leaves the object as blank as a skipped one.
    bad_init = {"Float8Quantizer": (torch.ones(2),), "LinearState": ("fp8",),
                "Float8CurrentScalingQuantizer": ("fp8",), "Quantizer": (),
                "Float8BlockQuantizer": ("e4m3", "block_2x2")}[sys.argv[1]]
    def after_failed_init():
        o = cls.__new__(cls)
        try:
            o.__init__(*bad_init)
        except (TypeError, ValueError):
            pass
        probe(o)
    report("after a failed __init__", after_failed_init)
    # A Python subclass made without __init__.
    sub = type("Sub", (cls,), {})
    report("subclass", lambda: probe(sub.__new__(sub)))
    # An unbound method called with an object of another type.
    unbound = cls.get_state if cls is ext.LinearState else (lambda o: cls.__call__(o, x))
    report("unbound method on another object", lambda: unbound(object()))
    print(json.dumps({"done": True}), flush=True)
""")

_EXPECTED = {  # at least these, so a listing that silently found nothing fails
    "Quantizer": {"__call__", "quantize", "update_quantized", "set_usage", "get fp8_dtype",
                  "get rowwise", "get columnwise"},
    "Float8Quantizer": {"__call__", "copy", "to", "__deepcopy__", "__repr__", "__getstate__",
                        "get scale", "get amax", "repr", "pickle", "copy.copy",
                        "copy.deepcopy", "update_quantized"},
    "Float8CurrentScalingQuantizer": {"__call__", "copy", "to", "__deepcopy__", "__repr__",
                                      "__getstate__", "get amax_epsilon", "get power_2_scale",
                                      "repr", "pickle", "update_quantized"},
    "Float8BlockQuantizer": {"__call__", "quantize", "update_quantized", "set_usage", "copy",
                             "to", "__deepcopy__", "__repr__", "__getstate__", "get fp8_dtype",
                             "get scaling_mode", "get rowwise", "get columnwise",
                             "get amax_epsilon", "get power_2_scale", "repr", "pickle",
                             "copy.copy", "copy.deepcopy"},
    "LinearState": {"get recipe", "get delayed", "get device", "get non_tn",
                    "get amax_history", "get amax", "get scale", "get scale_inv", "get seeded",
                    "get cache_weight", "set cache_weight", "get weight_cache_valid",
                    "clear_weight_cache", "to", "get_state", "linear_forward", "repr",
                    "pickle", "copy.deepcopy"},
}

# Cases that never reach our C++ code: object's default repr, and copy /
# pickle of the abstract base (no state to save), which Python handles.
_PLAIN_PYTHON = {"Quantizer": {"repr", "copy.copy", "copy.deepcopy", "pickle"},
                 "LinearState": {"repr", "copy.copy", "copy.deepcopy", "pickle"}}


@pytest.mark.parametrize("name", sorted(_EXPECTED))
def test_uninitialised_objects_raise_type_error(name):
    r = subprocess.run([sys.executable, "-c", _CHILD, name], capture_output=True, text=True,
                       timeout=300)
    lines = [json.loads(s) for s in r.stdout.splitlines() if s.startswith("{")]
    started = [d["case"] for d in lines if d.get("start")]
    assert r.returncode == 0 and lines and lines[-1] == {"done": True}, (
        f"the child died (rc {r.returncode}) in case {started[-1] if started else None!r}:\n"
        f"{r.stderr[-3000:]}")
    results = {d["case"]: d for d in lines if "error" in d}
    assert _EXPECTED[name] <= results.keys(), _EXPECTED[name] - results.keys()
    for case, d in results.items():
        if case in _PLAIN_PYTHON.get(name, ()):
            continue
        assert d["error"] == "TypeError", (case, d)
        msg = d["message"]
        if case == "unbound method on another object":
            assert "was called on a object object" in msg, (case, msg)
            continue
        assert "was not initialised" in msg and "construct it with" in msg, (case, msg)
        if name != "Quantizer" and case != "subclass":
            assert f"fp8kit.torch.{name}(" in msg or "LinearState(recipe" in msg, (case, msg)
