"""The C++ quantizer objects: one call from a torch tensor to a Float8Tensor,
with the same bits as the functional ops, checked inputs, and no leaked
references or memory."""

import copy
import gc
import pickle
import subprocess
import sys
import textwrap
import tracemalloc

import pytest
import torch

import fp8kit.torch as ft
from fp8kit.torch import Float8Tensor, QuantizedTensor
from torch_reference import assert_fp8_equal_reference, cuda_or_skip

_native = torch._C.TensorBase


def native_props(t):
    with torch._C.DisableTorchFunctionSubclass():
        return (_native.dtype.__get__(t), _native.shape.__get__(t), _native.device.__get__(t),
                _native.is_cuda.__get__(t), _native.requires_grad.__get__(t))


def cached_props(t):
    return (t._dtype, t._shape, t._device, t._is_cuda, t._requires_grad)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_current_scaling_quantizer_matches_functional_op(fmt, dtype):
    x = (torch.randn(24, 40) * 7).to(dtype)
    q = ft.Float8CurrentScalingQuantizer(fmt, rowwise=True, columnwise=True)
    f8 = q(x)
    assert type(f8) is Float8Tensor and isinstance(f8, QuantizedTensor)
    d, cw, scale, sinv, amax = ft.quantize_current_scaling(x, fmt, True, True)
    assert torch.equal(f8._data.view(torch.uint8), d.view(torch.uint8))
    assert torch.equal(f8._columnwise_data.view(torch.uint8), cw.view(torch.uint8))
    assert torch.equal(f8._scale_inv, sinv)
    assert f8.fp8_dtype == fmt and f8.quantizer is q
    assert cached_props(f8) == native_props(f8) == (dtype, x.shape, x.device, False, False)
    assert torch.equal(f8.dequantize(), ft.dequantize(d, sinv, dtype))


def test_delayed_quantizer_reads_scale_and_writes_amax():
    scale, amax = torch.tensor([4.0]), torch.zeros(1)
    q = ft.Float8Quantizer(scale, "e4m3", amax=amax, rowwise=True, columnwise=False)
    x = torch.randn(9, 33)
    f8 = q(x)
    assert f8._columnwise_data is None
    assert_fp8_equal_reference(f8._data, x, 4.0, "e4m3")
    assert f8._scale_inv.item() == 0.25 and amax.item() == x.abs().max().item()
    scale.fill_(0.5)  # the quantizer reads its scale tensor at every call
    f8b = q(x)
    assert_fp8_equal_reference(f8b._data, x, 0.5, "e4m3")
    assert f8._scale_inv.item() == 0.25  # earlier results keep their own scale_inv


def test_columnwise_only_and_set_usage():
    x = torch.randn(4, 6, 8)
    q = ft.Float8CurrentScalingQuantizer("e4m3", rowwise=False, columnwise=True)
    f8 = q(x)
    assert f8._data is None and f8._columnwise_data.shape == (8, 24)
    assert f8.shape == (4, 6, 8)
    ref = ft.Float8CurrentScalingQuantizer("e4m3")(x)
    assert torch.equal(f8.dequantize(), ref.dequantize())
    q.set_usage(rowwise=True)
    assert q.rowwise and q.columnwise
    with pytest.raises(ValueError, match="rowwise and columnwise are both False"):
        q.set_usage(rowwise=False, columnwise=False)
    assert q.rowwise and q.columnwise  # unchanged by the failed call


def test_python_and_cpp_creation_paths_set_the_same_fields():
    x = torch.randn(8, 16, dtype=torch.bfloat16)
    q = ft.Float8CurrentScalingQuantizer("e5m2")
    a = q(x)
    b = Float8Tensor(a._data, a._scale_inv, dtype=torch.bfloat16,
                     columnwise_data=a._columnwise_data, quantizer=q)
    assert sorted(vars(a)) == sorted(vars(b)) == sorted(Float8Tensor._FIELDS +
                                                        QuantizedTensor._CACHED)
    assert cached_props(a) == cached_props(b)
    assert a._fp8_dtype == b._fp8_dtype == "e5m2"


def test_update_quantized_writes_in_place():
    q = ft.Float8CurrentScalingQuantizer("e4m3")
    f8 = q(torch.randn(16, 16))
    ptrs = (f8._data.data_ptr(), f8._columnwise_data.data_ptr(), f8._scale_inv.data_ptr())
    y = torch.randn(16, 16) * 100
    assert q.update_quantized(y, f8) is f8
    assert ptrs == (f8._data.data_ptr(), f8._columnwise_data.data_ptr(), f8._scale_inv.data_ptr())
    want = q(y)
    assert torch.equal(f8._data.view(torch.uint8), want._data.view(torch.uint8))
    assert torch.equal(f8._columnwise_data.view(torch.uint8),
                       want._columnwise_data.view(torch.uint8))
    with pytest.raises(ValueError, match=r"src has shape \[4, 4\] but dst has shape \[16, 16\]"):
        q.update_quantized(torch.randn(4, 4), f8)
    with pytest.raises(TypeError, match="dst holds e4m3 data but the quantizer makes e5m2"):
        ft.Float8CurrentScalingQuantizer("e5m2").update_quantized(y, f8)
    with pytest.raises(TypeError, match="expected an fp8kit Float8Tensor"):
        q.update_quantized(y, torch.zeros(16, 16))


def test_bad_inputs_raise_clear_errors():
    q = ft.Float8CurrentScalingQuantizer("e4m3")
    with pytest.raises(TypeError, match=r"x has dtype torch.int64; expected torch.float32"):
        q(torch.ones(3, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"x is a tensor without dense storage.*dequantize"):
        q(q(torch.randn(4)))
    with pytest.raises(ValueError, match="fp8_dtype is 'fp8'"):
        ft.Float8CurrentScalingQuantizer("fp8")
    with pytest.raises(ValueError, match="rowwise and columnwise are both False"):
        ft.Float8CurrentScalingQuantizer("e4m3", False, False)
    with pytest.raises(ValueError, match="amax_epsilon is -0.5"):
        ft.Float8CurrentScalingQuantizer("e4m3", amax_epsilon=-0.5)
    with pytest.raises(TypeError, match=r"scale has dtype torch.float16"):
        ft.Float8Quantizer(torch.ones(1, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"scale has shape \[2\]"):
        ft.Float8Quantizer(torch.ones(2))
    with pytest.raises(ValueError, match="amax is on meta but scale is on cpu"):
        ft.Float8Quantizer(torch.ones(1), amax=torch.zeros(1, device="meta"))


def _resize(n):
    return lambda t: t.resize_(n)


def _replace_data(t2):
    def change(t):
        t.data = t2
    return change


@pytest.mark.parametrize("which", ["scale", "amax"])
@pytest.mark.parametrize("change, error, found", [
    (_resize(0), ValueError, r"torch.float32 of shape \[0\] on cpu"),
    (_resize(4), ValueError, r"torch.float32 of shape \[4\] on cpu"),
    (_replace_data(torch.ones(1, dtype=torch.float64)), TypeError,
     r"torch.float64 of shape \[1\] on cpu"),
    (_replace_data(torch.ones(1, dtype=torch.bfloat16)), TypeError,
     r"torch.bfloat16 of shape \[1\] on cpu"),
    (lambda t: t.set_(torch.ones(8)[::2]), ValueError, r"torch.float32 of shape \[4\] on cpu"),
])
def test_state_tensors_changed_after_construction_are_caught_at_the_call(which, change, error,
                                                                         found):
    scale, amax = torch.ones(1), torch.zeros(1)
    q = ft.Float8Quantizer(scale, "e4m3", amax=amax)
    x = torch.randn(4, 16)
    f8 = q(x)
    change(scale if which == "scale" else amax)
    msg = (f"the quantizer's {which} is now {found}; it must stay the contiguous torch.float32 "
           r"tensor of shape \[1\] it was constructed with \(it was resized or replaced")
    with pytest.raises(error, match=r"Quantizer.__call__: " + msg):
        q(x)
    with pytest.raises(error, match=r"update_quantized: " + msg):
        q.update_quantized(x, f8)


def test_constructor_arguments_have_strict_types():
    with pytest.raises(TypeError, match=r"Float8Quantizer: scale is \[1.0\] \(list\); it must be "
                                        "a torch.Tensor"):
        ft.Float8Quantizer([1.0])
    with pytest.raises(TypeError, match=r"Float8Quantizer: fp8_dtype is None \(NoneType\)"):
        ft.Float8Quantizer(torch.ones(1), fp8_dtype=None)
    with pytest.raises(TypeError, match=r"Float8Quantizer: amax is 0.0 \(float\)"):
        ft.Float8Quantizer(torch.ones(1), amax=0.0)
    with pytest.raises(TypeError, match=r"Quantizer.__call__: x is 'x' \(str\)"):
        ft.Float8CurrentScalingQuantizer()("x")
    with pytest.raises(TypeError, match=r"update_quantized: src is None \(NoneType\)"):
        q = ft.Float8CurrentScalingQuantizer()
        q.update_quantized(None, q(torch.ones(4)))
    with pytest.raises(TypeError, match=r"amax_epsilon is True \(bool\); it must be a float"):
        ft.Float8CurrentScalingQuantizer("e4m3", amax_epsilon=True)
    with pytest.raises(ValueError, match="amax_epsilon is inf; it must be a finite float >= 0"):
        ft.Float8CurrentScalingQuantizer("e4m3", amax_epsilon=float("inf"))
    with pytest.raises(TypeError, match=r"device is 3 \(int\); it must be a torch.device"):
        ft.Float8Quantizer(torch.ones(1)).to(3)
    with pytest.raises(ValueError, match="device is 'gpu7'; it must name a device"):
        ft.Float8Quantizer(torch.ones(1)).to("gpu7")
    c = ft.Float8CurrentScalingQuantizer("e4m3")
    with pytest.raises(TypeError, match=r"__setstate__: rowwise is 1 \(int\); it must be a bool"):
        c.__class__.__new__(c.__class__).__setstate__(("e4m3", 1, True, 0.0, False))
    with pytest.raises(ValueError, match="the pickled state has 2 entries"):
        c.__class__.__new__(c.__class__).__setstate__(("e4m3", True))


def test_quantizers_pickle_deepcopy_copy():
    scale, amax = torch.tensor([3.0]), torch.zeros(1)
    q = ft.Float8Quantizer(scale, "e5m2", amax=amax, rowwise=False, columnwise=True)
    for r in (pickle.loads(pickle.dumps(q)), copy.deepcopy(q), q.copy()):
        assert type(r) is ft.Float8Quantizer
        assert (r.fp8_dtype, r.rowwise, r.columnwise) == ("e5m2", False, True)
        assert r.scale.item() == 3.0 and r.amax.item() == 0.0
        assert r.scale.data_ptr() != scale.data_ptr()  # its own state
    c = ft.Float8CurrentScalingQuantizer("e4m3", True, False, 1e-4, True)
    for r in (pickle.loads(pickle.dumps(c)), copy.deepcopy(c), c.copy()):
        assert (r.fp8_dtype, r.rowwise, r.columnwise, r.power_2_scale) == ("e4m3", True, False,
                                                                            True)
        assert r.amax_epsilon == pytest.approx(1e-4)
    assert "Float8CurrentScalingQuantizer(fp8_dtype='e4m3'" in repr(c)


def test_quantizer_for_recipe():
    r = ft.CurrentScaling(fp8_format=ft.Format.HYBRID)
    assert ft.quantizer_for(r).fp8_dtype == "e4m3"
    assert ft.quantizer_for(r, backward=True).fp8_dtype == "e5m2"
    with pytest.raises(ValueError, match="needs its scale tensor"):
        ft.quantizer_for(ft.DelayedScaling())
    assert ft.quantizer_for(ft.DelayedScaling(), scale=torch.ones(1)).fp8_dtype == "e4m3"


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _collect_all_garbage():
    """gc.collect() until a pass finds nothing: one pass can leave garbage
    that its finalizers and weakref callbacks freed (torch.compile's and
    torch.export's leftovers from earlier tests do), which a later pass, or
    an automatic collection during the measured loop, would then release."""
    for _ in range(10):
        if not gc.collect():
            return


def test_no_leaks_over_100k_tensors():
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    q = ft.Float8CurrentScalingQuantizer("e4m3")
    scale, amax = torch.ones(1), torch.zeros(1)
    qd = ft.Float8Quantizer(scale, "e5m2", amax=amax)

    def run(n):
        for _ in range(n):
            f = q(x)
            g = qd(x)
            del f, g

    run(2000)  # warm up: lazy lookups, allocator pools
    _collect_all_garbage()
    watched = [q, qd, x, scale, amax, Float8Tensor, torch.bfloat16, torch.float8_e4m3fn]
    before = [sys.getrefcount(o) for o in watched]
    rss0 = _rss_bytes()
    tracemalloc.start()
    snap0 = tracemalloc.take_snapshot()
    run(50_000)  # 100,000 tensors
    _collect_all_garbage()
    snap1 = tracemalloc.take_snapshot()
    tracemalloc.stop()
    after = [sys.getrefcount(o) for o in watched]
    assert before == after, list(zip(map(repr, watched), before, after))
    grown = sum(s.size_diff for s in snap1.compare_to(snap0, "filename"))
    assert grown < 256 * 1024, f"Python heap grew by {grown} bytes"
    assert _rss_bytes() - rss0 < 16 * 1024 * 1024, "process memory grew"


def test_first_use_from_many_threads():
    # The Python types are looked up once, on first use, under pybind11's
    # GIL-safe call_once: race eight threads to it in a fresh process.
    code = textwrap.dedent("""
        import threading, torch, fp8kit.torch as ft
        q = ft.Float8CurrentScalingQuantizer("e4m3")
        x = torch.randn(8, 16)
        go, out = threading.Barrier(8), []
        def work():
            go.wait()
            out.append(type(q(x)).__name__)
        ts = [threading.Thread(target=work) for _ in range(8)]
        [t.start() for t in ts]; [t.join() for t in ts]
        assert out == ["Float8Tensor"] * 8, out
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


# ------------------------------------------------------------------- CUDA ----
@pytest.mark.gpu
def test_cuda_quantizers_match_cpu_and_use_current_stream():
    dev = cuda_or_skip()
    x = torch.randn(257, 96) * 3
    for q in (ft.Float8CurrentScalingQuantizer("e4m3"),
              ft.Float8CurrentScalingQuantizer("e5m2", power_2_scale=True)):
        c, g = q(x), q(x.to(dev))
        assert g.device == dev and g.is_cuda and g._data.device == dev
        assert torch.equal(g._data.cpu().view(torch.uint8), c._data.view(torch.uint8))
        assert torch.equal(g._columnwise_data.cpu().view(torch.uint8),
                           c._columnwise_data.view(torch.uint8))
        assert g._scale_inv.item() == c._scale_inv.item()
    qd = ft.Float8Quantizer(torch.tensor([2.0], device=dev), "e4m3",
                            amax=torch.zeros(1, device=dev))
    s = torch.cuda.Stream()
    y = torch.randn(4096, 4096, device=dev)
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        f8 = qd(y)
    torch.cuda.current_stream().wait_stream(s)
    assert_fp8_equal_reference(f8._data, y.cpu(), 2.0, "e4m3")
    with pytest.raises(ValueError, match="x is on cpu but the quantizer's scale is on cuda"):
        qd(x)


@pytest.mark.gpu
def test_cuda_no_leaks():
    dev = cuda_or_skip()
    x = torch.randn(64, 64, device=dev, dtype=torch.bfloat16)
    q = ft.Float8CurrentScalingQuantizer("e4m3")
    for _ in range(1000):
        q(x)
    torch.cuda.synchronize()
    m0, r0 = torch.cuda.memory_allocated(dev), sys.getrefcount(q)
    for _ in range(20_000):
        q(x)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated(dev) == m0 and sys.getrefcount(q) == r0
