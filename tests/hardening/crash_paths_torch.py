"""The paths of fp8kit.torch most likely to crash the process rather than
raise: extension objects whose __init__ never ran, quantizer state tensors
changed behind the quantizer's back, Linear checkpoints with broken FP8
state entries. Each must raise a clear error (TypeError / ValueError /
NotImplementedError naming the class or function), never crash, print
uninitialised memory or compute with garbage. Run in a child process by
test_crash_paths.py, so that a segfault fails one test."""

import copy
import pickle

import torch

import fp8kit.torch as ft
from fp8kit.recipe import CurrentScaling, DelayedScaling
from fp8kit.torch._ext import ext
from clear_errors import CLEAR_ERRORS, expect_clear_error
from fp8_strategies import log_example
from torch_support import device_or_skip

torch.set_num_threads(1)


def check_extension_classes_listed(device, listed):
    """The parent runs one uninitialised-object test per class it lists:
    that list must name every class the extension defines."""
    device_or_skip(device)
    defined = {k for k, v in vars(ext).items()
               if isinstance(v, type) and getattr(v, "__module__", "").startswith("fp8kit")}
    assert defined == set(listed), (
        f"tests/hardening/test_crash_paths.py lists {sorted(listed)}; the extension defines "
        f"{sorted(defined)}")


def _operations(obj, device):
    """(name, call) of what a user can do with an extension object."""
    x = torch.randn(4, 16, device=device)
    f8 = ft.Float8CurrentScalingQuantizer()(x)
    ops = [("__call__", lambda: obj(x)), ("quantize", lambda: obj.quantize(x)),
           ("update_quantized", lambda: obj.update_quantized(x, f8)),
           ("set_usage", lambda: obj.set_usage(True, True)), ("copy", lambda: obj.copy()),
           ("to", lambda: obj.to(device)), ("deepcopy", lambda: copy.deepcopy(obj)),
           ("pickle", lambda: pickle.loads(pickle.dumps(obj))), ("repr", lambda: repr(obj)),
           ("use_recipe", lambda: obj.use_recipe(DelayedScaling())),
           ("get_state", lambda: obj.get_state()), ("clear_weight_cache",
                                                     lambda: obj.clear_weight_cache())]
    for attr in ("fp8_dtype", "rowwise", "columnwise", "scale", "amax", "amax_epsilon",
                 "power_2_scale", "delayed", "device", "non_tn", "amax_history", "scale_inv",
                 "seeded", "cache_weight", "weight_cache_valid"):
        ops.append((attr, (lambda a: lambda: getattr(obj, a))(attr)))
    generic = ("deepcopy", "pickle", "repr")
    return [(n, f) for n, f in ops
            if n in generic or (callable(obj) if n == "__call__" else n in dir(type(obj)))]


def check_uninitialised_extension_object(device, cls_name):
    """T.__new__(T) skips __init__: every method then raises a clear error
    naming the class (repr may instead say the object is not initialised,
    but must not show uninitialised memory)."""
    dev = device_or_skip(device)
    cls = getattr(ext, cls_name)
    obj = cls.__new__(cls)
    problems = []
    for name, call in _operations(obj, dev):
        log_example("uninitialised object", {"cls": cls_name, "op": name})
        try:
            result = call()
        except CLEAR_ERRORS as e:
            if cls_name not in str(e):
                problems.append(f"{cls_name}.{name}: the error does not name the class: "
                                f"{type(e).__name__}: {e}")
            continue
        except Exception as e:  # noqa: BLE001
            problems.append(f"{cls_name}.{name}: {type(e).__name__}: {e}")
            continue
        if name == "repr":
            # A class without a repr of its own shows object.__repr__, which
            # reads no state; one with its own must say it is uninitialised.
            default = f"<{type(obj).__module__}.{cls_name} object at 0x"
            if not str(result).startswith(default) and "initiali" not in str(result).lower():
                problems.append(f"repr of an uninitialised {cls_name} is {result!r}")
        else:
            problems.append(f"{cls_name}.{name} on an uninitialised object returned "
                            f"{type(result).__name__} instead of raising")
    assert not problems, "\n".join(problems)


def check_subclass_skipping_base_init(device):
    dev = device_or_skip(device)

    class Lazy(ft.Float8CurrentScalingQuantizer):
        def __init__(self):  # never calls the base __init__
            pass

    try:
        q = Lazy()
    except TypeError:
        return  # refused at construction: fine
    expect_clear_error("Float8CurrentScalingQuantizer", q, torch.randn(4, 16, device=dev))


def check_quantizer_state_changed_after_construction(device):
    """A quantizer's scale / amax tensor resized, or re-typed through .data,
    after construction: the next call raises a clear error naming the
    quantizer instead of reading out of bounds or the wrong type."""
    dev = device_or_skip(device)
    x = torch.randn(4, 16, device=dev)
    changes = {
        "scale.resize_(0)": lambda q: q.scale.resize_(0),
        "scale.resize_(4)": lambda q: q.scale.resize_(4),
        "scale.data = float64": lambda q: setattr(q.scale, "data",
                                                  torch.ones(1, dtype=torch.float64, device=dev)),
        "scale.data = shape [2]": lambda q: setattr(q.scale, "data", torch.ones(2, device=dev)),
        "amax.resize_(0)": lambda q: q.amax.resize_(0),
        "amax.data = float16": lambda q: setattr(q.amax, "data",
                                                 torch.zeros(1, dtype=torch.float16, device=dev)),
    }
    problems = []
    for what, change in changes.items():
        q = ft.Float8Quantizer(torch.ones(1, device=dev), "e4m3", torch.zeros(1, device=dev))
        change(q)
        for call in ("__call__", "update_quantized"):
            log_example("quantizer state changed", {"change": what, "then": call})
            try:
                if call == "__call__":
                    q(x)
                else:
                    f8 = ft.Float8CurrentScalingQuantizer()(x)
                    q.update_quantized(x, f8)
            except CLEAR_ERRORS as e:
                if "Quantizer" not in str(e):
                    problems.append(f"{what}, then {call}: the error does not name the "
                                    f"quantizer: {e}")
                continue
            except Exception as e:  # noqa: BLE001
                problems.append(f"{what}, then {call}: {type(e).__name__}: {e}")
                continue
            problems.append(f"{what}, then {call}: accepted without an error")
    assert not problems, "\n".join(problems)


def _trained_state(recipe, device):
    layer = ft.Linear(32, 16, device=device)
    with ft.autocast(recipe=recipe):
        layer(torch.randn(8, 32, device=device)).sum().backward()
    return layer.state_dict()


def check_linear_checkpoint_broken_fp8_entries(device):
    """Loading a Linear checkpoint whose FP8 state has a missing or
    mis-typed entry, or (delayed scaling, whose scales the next steps cast
    with) a scale that is not finite and > 0, raises a clear error naming
    the entry."""
    dev = device_or_skip(device)
    problems = []
    for recipe in (DelayedScaling(amax_history_len=4), CurrentScaling()):
        sd = _trained_state(recipe, dev)
        extra = sd["_extra_state"]
        for key in [k for k in extra if k != "format"]:
            variants = {"missing": None, "a string": "oops", "a list": [1, 2]}
            if isinstance(extra[key], torch.Tensor):
                t = extra[key]
                variants.update({"float64": t.double(), "one element more": torch.cat(
                    [t.reshape(-1), t.reshape(-1)[:1]]), "empty": t.reshape(-1)[:0]})
                if key in ("scale", "scale_inv") and isinstance(recipe, DelayedScaling):
                    variants.update({"NaN": torch.full_like(t, float("nan")),
                                     "inf": torch.full_like(t, float("inf")),
                                     "zero": torch.zeros_like(t), "negative": -t.abs() - 1})
            for how, value in variants.items():
                bad = dict(extra)
                if value is None:
                    del bad[key]
                else:
                    bad[key] = value
                broken = dict(sd, _extra_state=bad)
                fresh = ft.Linear(32, 16, device=dev)
                log_example("broken checkpoint", {"recipe": type(recipe).__name__, "key": key,
                                                  "how": how})
                try:
                    fresh.load_state_dict(broken)
                except CLEAR_ERRORS as e:
                    if key not in str(e):
                        problems.append(f"{key} {how}: the error does not name '{key}': {e}")
                    continue
                except Exception as e:  # noqa: BLE001
                    problems.append(f"{key} {how}: {type(e).__name__}: {str(e)[:300]}")
                    continue
                problems.append(f"{type(recipe).__name__} state with '{key}' {how}: loaded "
                                "without an error")
    assert not problems, "\n".join(problems)
