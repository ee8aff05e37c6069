"""Float8Tensor: cached properties on every creation path, setters that keep
them in sync, the __torch_dispatch__ op table (views and copies keep data and
columnwise data together, unknown ops that only read run in high precision,
in-place ops re-quantize), autograd, pickling and deepcopy. Writes in depth:
test_torch_float8_mutation.py."""

import copy
import io
import pickle

import pytest
import torch

import fp8kit.torch as ft
from fp8kit.torch import Float8Tensor
from torch_reference import cuda_or_skip

_native = torch._C.TensorBase


def assert_cache_in_sync(t):
    assert isinstance(t, Float8Tensor)
    with torch._C.DisableTorchFunctionSubclass():
        native = (_native.dtype.__get__(t), _native.shape.__get__(t), _native.device.__get__(t),
                  _native.is_cuda.__get__(t), _native.requires_grad.__get__(t))
    cached = (t._dtype, t._shape, t._device, t._is_cuda, t._requires_grad)
    assert cached == native
    assert (t.dtype, t.shape, t.device, t.is_cuda, t.requires_grad) == native
    assert type(t._shape) is torch.Size


def f8(shape=(32, 16), dtype=torch.bfloat16, fmt="e4m3", rowwise=True, columnwise=True):
    g = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(shape, generator=g) * 4).to(dtype)
    return ft.Float8CurrentScalingQuantizer(fmt, rowwise, columnwise)(x), x


def bits(t):
    return None if t is None else t.view(torch.uint8)


# ------------------------------------------------------- creation paths ----
def test_every_creation_path_sets_the_cache():
    a, _ = f8()
    paths = {
        "quantizer": a,
        "constructor": Float8Tensor(a._data, a._scale_inv, dtype=torch.bfloat16,
                                    columnwise_data=a._columnwise_data, requires_grad=True),
        "detach": a.detach(),
        "clone": a.clone(),
        "deepcopy": copy.deepcopy(a),
        "pickle": pickle.loads(pickle.dumps(a)),
        "to(cpu)": a.to("cpu"),
        "to(same dtype)": a.to(torch.bfloat16),
        "view": a.view(16, 32),
        "reshape": a.reshape(-1),
        "t": a.t(),
        "transpose": a.transpose(0, 1),
        "data": a.data,
        "copy_": a.clone().copy_(a),
        "mul_": a.clone().mul_(2),
    }
    buf = io.BytesIO()
    torch.save(a, buf)
    buf.seek(0)
    paths["torch.load"] = torch.load(buf)
    buf.seek(0)
    paths["torch.load(weights_only)"] = torch.load(buf, weights_only=True)
    for name, t in paths.items():
        assert isinstance(t, Float8Tensor), name
        assert_cache_in_sync(t)


def test_requires_grad_paths_keep_the_cache_in_sync():
    a, _ = f8()
    a.requires_grad = True                 # setter
    assert_cache_in_sync(a)
    v = a.view(16, 32)                     # autograd gives the view requires_grad
    assert v.requires_grad
    assert_cache_in_sync(v)
    with pytest.raises(RuntimeError):      # torch's setter fails: cache unchanged
        v.requires_grad = False
    assert v.requires_grad
    assert_cache_in_sync(v)
    d = a.detach()
    assert not d.requires_grad
    assert_cache_in_sync(d)
    d.requires_grad_()                     # in-place method
    assert_cache_in_sync(d)
    assert d.requires_grad
    c = copy.deepcopy(a)                   # a leaf requiring grad stays one
    assert c.requires_grad and c.is_leaf
    assert_cache_in_sync(c)
    p = pickle.loads(pickle.dumps(a))
    assert p.requires_grad
    assert_cache_in_sync(p)
    with torch.no_grad():
        w = a.view(16, 32)
        e = a * 2
    assert_cache_in_sync(w)
    assert not e.requires_grad


# ------------------------------------------------------------- op table ----
def test_view_keeps_data_and_columnwise_data_together():
    a, x = f8((4, 8, 16))
    v = a.view(32, 16)                     # same last dim: both layouts are aliases
    assert v._owner is a and v._data is None and v._columnwise_data is None
    assert v.rowwise_data.data_ptr() == a._data.data_ptr()
    assert v.columnwise_data.data_ptr() == a._columnwise_data.data_ptr()
    w = a.view(4, 128)                     # new last dim: columnwise copy computed on read
    assert w.rowwise_data.data_ptr() == a._data.data_ptr()
    assert torch.equal(bits(w.columnwise_data), bits(a._data).reshape(4, 128).t())
    assert torch.equal(w.dequantize(), a.dequantize().view(4, 128))
    assert_cache_in_sync(w)


def test_transpose_swaps_the_layouts():
    a, _ = f8((24, 48))
    t = a.t()
    assert t.shape == (48, 24)
    assert t.rowwise_data.data_ptr() == a._columnwise_data.data_ptr()
    assert t.columnwise_data.data_ptr() == a._data.data_ptr()
    assert torch.equal(t.dequantize(), a.dequantize().t())
    r, _ = f8((24, 48), columnwise=False)  # only rowwise: the rowwise layout is computed
    tr = r.transpose(0, 1)
    assert torch.equal(tr.dequantize(), r.dequantize().t())
    assert tr.columnwise_data.data_ptr() == r._data.data_ptr()
    assert torch.equal(bits(tr.rowwise_data), bits(r._data).t())


def test_clone_is_independent_and_copy_is_bitwise():
    a, x = f8()
    c = a.clone()
    assert c._data.data_ptr() != a._data.data_ptr()
    assert torch.equal(bits(c._data), bits(a._data))
    b, _ = f8()
    b.mul_(0)                              # different contents, same format
    b.copy_(a)
    assert torch.equal(bits(b._data), bits(a._data))
    assert torch.equal(bits(b._columnwise_data), bits(a._columnwise_data))
    assert torch.equal(b._scale_inv, a._scale_inv)


def test_copy_from_high_precision_requantizes():
    a, x = f8()
    ptr = a._data.data_ptr()
    y = torch.randn(32, 16) * 100
    a.copy_(y)
    assert a._data.data_ptr() == ptr       # written in place
    want = ft.Float8CurrentScalingQuantizer("e4m3")(y)  # quantized from fp32 directly
    assert torch.equal(bits(a._data), bits(want._data))
    assert torch.equal(bits(a._columnwise_data), bits(want._columnwise_data))
    plain = torch.empty(32, 16, dtype=torch.bfloat16)
    plain.copy_(a)
    assert torch.equal(plain, a.dequantize())


def test_unknown_ops_run_in_high_precision():
    a, x = f8()
    hp = a.dequantize()
    for got, want in ((a + 1, hp + 1), (a * a, hp * hp), (torch.relu(a), torch.relu(hp)),
                      (a.sum(), hp.sum()), (torch.cat([a, a]), torch.cat([hp, hp])),
                      (a @ a.t(), hp @ hp.t()), (a[3:5] * 1, hp[3:5])):
        assert type(got) is torch.Tensor
        assert torch.equal(got, want)


def test_in_place_ops_requantize():
    a, x = f8()
    hp = a.dequantize()
    ptrs = (a._data.data_ptr(), a._columnwise_data.data_ptr())
    r = a.mul_(3.0)
    assert r is a and (a._data.data_ptr(), a._columnwise_data.data_ptr()) == ptrs
    want = ft.Float8CurrentScalingQuantizer("e4m3")(hp * 3.0)
    assert torch.equal(bits(a._data), bits(want._data))
    assert torch.equal(bits(a._columnwise_data), bits(want._columnwise_data))
    a.zero_()
    assert torch.count_nonzero(a.dequantize()) == 0
    out = torch.add(hp, 1.0, out=a)        # out= writes re-quantize too
    assert out is a
    assert torch.equal(a.dequantize(), ft.Float8CurrentScalingQuantizer("e4m3")(hp + 1)
                       .dequantize())


def test_in_place_without_quantizer_keeps_the_scale():
    a, x = f8()
    b = Float8Tensor(a._data.clone(), a._scale_inv.clone(), dtype=torch.bfloat16)
    s = b._scale_inv.item()
    b.add_(0.0)
    assert b._scale_inv.item() == s
    assert torch.equal(bits(b._data), bits(a._data))


def test_to_dtype_dequantizes_and_to_device_keeps_the_subclass():
    a, _ = f8()
    f = a.to(torch.float32)
    assert type(f) is torch.Tensor and torch.equal(f, a.dequantize(dtype=torch.float32))
    assert type(a.float()) is torch.Tensor
    c = a.to("cpu", copy=True)
    assert type(c) is Float8Tensor and c._data.data_ptr() != a._data.data_ptr()


def test_autograd_flows_through_dequantize_and_fallback_ops():
    a, _ = f8(dtype=torch.float32)
    a.requires_grad = True
    (a * 3).sum().backward()
    assert a.grad is not None and torch.equal(a.grad, torch.full((32, 16), 3.0))
    b, _ = f8(dtype=torch.float32)
    b.requires_grad = True
    b.dequantize().square().sum().backward()
    assert torch.allclose(b.grad, 2 * b.dequantize().detach())


def test_constructor_checks():
    a, _ = f8()
    with pytest.raises(ValueError, match="data and columnwise_data are both None"):
        Float8Tensor(None, a._scale_inv)
    with pytest.raises(TypeError, match="data has dtype torch.bfloat16"):
        Float8Tensor(torch.zeros(2, dtype=torch.bfloat16), a._scale_inv)
    with pytest.raises(TypeError, match="scale_inv must be a float32 tensor with one element"):
        Float8Tensor(a._data, torch.ones(2))
    with pytest.raises(ValueError, match="columnwise_data has shape"):
        Float8Tensor(a._data, a._scale_inv, columnwise_data=a._data)
    with pytest.raises(TypeError, match="nominal dtype must be"):
        Float8Tensor(a._data, a._scale_inv, dtype=torch.int32)
    s, _ = f8((16, 16))                    # in-place ops write the buffers densely
    with pytest.raises(ValueError, match="data is not contiguous"):
        Float8Tensor(s._data.t(), s._scale_inv)
    with pytest.raises(ValueError, match="columnwise_data is not contiguous"):
        Float8Tensor(s._data, s._scale_inv, columnwise_data=s._columnwise_data.t())


def test_update_usage_and_repr():
    a, _ = f8(columnwise=False)
    a.update_usage(columnwise=True)
    assert torch.equal(bits(a._columnwise_data), bits(a._data).t())
    a.update_usage(rowwise=False)
    assert a._data is None
    assert torch.equal(a.dequantize(), f8()[0].dequantize())
    a.update_usage(rowwise=True)
    assert "Float8Tensor(fp8_dtype=e4m3, shape=(32, 16)" in repr(a)


# ------------------------------------------------------------------ CUDA ----
@pytest.mark.gpu
def test_cuda_to_and_back():
    dev = cuda_or_skip()
    a, _ = f8()
    g = a.to(dev)
    assert type(g) is Float8Tensor and g.is_cuda and g._data.is_cuda
    assert_cache_in_sync(g)
    assert torch.equal(bits(g._data).cpu(), bits(a._data))
    back = g.cpu()
    assert_cache_in_sync(back)
    assert torch.equal(back.dequantize(), a.dequantize())
    assert torch.equal(g.dequantize().cpu(), a.dequantize())
    g.mul_(2)
    assert torch.equal(g.dequantize().cpu(),
                       ft.Float8CurrentScalingQuantizer("e4m3")(a.dequantize() * 2).dequantize())
