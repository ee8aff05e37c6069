"""Float8BlockTensor and Float8BlockQuantizer: one-call construction with
the cached properties set on every creation path, dequantization, the op
table (identity views share buffers, copies, in-place writes re-quantize
every copy, other reads run on the dequantized values, other views raise),
pickling, deepcopy, weights-only loading, quantizer_for(BlockScaling) and
the quantizer's own errors."""

import copy
import io
import pickle

import pytest
import torch

import fp8kit.torch as ft
from fp8kit.recipe import BlockScaling, Format

MODES = ("block_1x128", "block_128x128")


def sample(shape=(130, 256), dtype=torch.bfloat16, seed=0):
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 4).to(dtype)


def fields(t):
    return {n: getattr(t, n) for n in ft.Float8BlockTensor._FIELDS}


def assert_same_quantized(a, b):
    for n in ("_data", "_columnwise_data"):
        x, y = getattr(a, n), getattr(b, n)
        assert (x is None) == (y is None), n
        if x is not None:
            assert torch.equal(x.view(torch.uint8), y.view(torch.uint8)), n
    for n in ("_block_scale_inv", "_columnwise_block_scale_inv"):
        x, y = getattr(a, n), getattr(b, n)
        assert (x is None) == (y is None), n
        if x is not None:
            assert torch.equal(x, y), n
    assert (a.fp8_dtype, a.scaling_mode, a.shape, a.dtype) == (b.fp8_dtype, b.scaling_mode,
                                                               b.shape, b.dtype)


def assert_cache_matches_torch(t):
    with torch._C.DisableTorchFunctionSubclass():
        native = (torch.Tensor.dtype.__get__(t), torch.Tensor.shape.__get__(t),
                  torch.Tensor.device.__get__(t), torch.Tensor.requires_grad.__get__(t))
    assert (t.dtype, t.shape, t.device, t.requires_grad) == native
    assert t.is_cuda == (t.device.type == "cuda")


@pytest.mark.parametrize("mode", MODES)
def test_quantizer_builds_the_tensor_in_one_call(mode):
    x = sample()
    q = ft.Float8BlockQuantizer("e4m3", mode)
    t = q(x)
    assert type(t) is ft.Float8BlockTensor and t.quantizer is q
    assert_cache_matches_torch(t)
    assert (t.fp8_dtype, t.scaling_mode, t.shape, t.dtype) == ("e4m3", mode, x.shape, x.dtype)
    d, s, cw, cws = ft.quantize_block(x, "e4m3", mode, True, True)
    python_made = ft.Float8BlockTensor(d, s, dtype=x.dtype, scaling_mode=mode,
                                       columnwise_data=cw, columnwise_block_scale_inv=cws,
                                       quantizer=q)
    assert_same_quantized(t, python_made)
    assert fields(t).keys() == fields(python_made).keys()
    assert torch.equal(t.dequantize(), ft.dequantize_block(d, s, mode, x.dtype))


def test_one_copy_tensors_dequantize_from_the_copy_they_hold():
    x = sample((3, 40, 256), torch.float32)
    for rowwise in (True, False):
        t = ft.Float8BlockQuantizer("e5m2", "block_1x128", rowwise, not rowwise)(x)
        assert (t.rowwise_data is None) != rowwise and (t.columnwise_data is None) == rowwise
        want = (ft.dequantize_block(t.rowwise_data, t.block_scale_inv, "block_1x128")
                if rowwise else
                ft.dequantize_block(t.columnwise_data, t.columnwise_block_scale_inv,
                                    "block_1x128", torch.float32, True, x.shape))
        assert t.dequantize().shape == x.shape and torch.equal(t.dequantize(), want)
        torch.testing.assert_close(t.dequantize(), x, rtol=2 ** -2, atol=1e-3)


def test_reads_run_on_the_dequantized_values_and_views_raise():
    x = sample()
    t = ft.Float8BlockQuantizer()(x)
    hp = t.dequantize()
    for got, want in ((t + 1, hp + 1), (torch.matmul(t, hp.t()), hp @ hp.t()),
                      (t.sum(0), hp.sum(0)), (t.to(torch.float32), hp.float())):
        assert type(got) is torch.Tensor and torch.equal(got, want)
    with pytest.raises(NotImplementedError, match="view op .* t.dequantize\\(\\)"):
        t.view(-1)
    with pytest.raises(NotImplementedError, match="view op"):
        t[1:]


@pytest.mark.parametrize("mode", MODES)
def test_in_place_writes_requantize_every_copy(mode):
    x = sample()
    q = ft.Float8BlockQuantizer("e4m3", mode, power_2_scale=False)
    t = q(x)
    t.mul_(3)  # on the dequantized bf16 values, then re-quantized
    assert_same_quantized(t, q(q(x).dequantize() * 3))
    t.copy_(x.flip(0))
    assert_same_quantized(t, q(x.flip(0)))
    other = q(x * 2)
    t.copy_(other)  # same format and mode: the bits are copied
    assert_same_quantized(t, other)
    t.zero_()
    assert (t.rowwise_data.view(torch.uint8) == 0).all() and (t.dequantize() == 0).all()
    plain = torch.empty_like(x)
    plain.copy_(other)
    assert torch.equal(plain, other.dequantize())


def test_identity_views_share_buffers_and_copies_do_not():
    q = ft.Float8BlockQuantizer("e4m3", "block_128x128")
    t = q(sample())
    p = torch.nn.Parameter(t)
    assert type(p.data) is ft.Float8BlockTensor and p.requires_grad
    assert_cache_matches_torch(p)
    with torch.no_grad():
        p.add_(1)  # through the parameter: reaches t's buffers
    assert_same_quantized(t, q(q(sample()).dequantize() + 1))
    c = t.clone()
    c.zero_()
    assert not (t.dequantize() == 0).all()
    d = t.detach()
    assert d.rowwise_data is t.rowwise_data and d.quantizer is t.quantizer


def test_requires_grad_and_straight_through_gradient():
    t = ft.Float8BlockQuantizer()(sample(dtype=torch.float32))
    t.requires_grad = True
    assert_cache_matches_torch(t)
    t.dequantize().sum().backward()
    assert torch.equal(t.grad, torch.ones(t.shape))


def test_pickle_deepcopy_save_and_weights_only_load():
    q = ft.Float8BlockQuantizer("e5m2", "block_128x128", True, False, 0.5, False)
    t = q(sample((200, 136)))
    for back in (pickle.loads(pickle.dumps(t)), copy.deepcopy(t)):
        assert_same_quantized(back, t)
        assert_cache_matches_torch(back)
        assert repr(back.quantizer) == repr(q) and back.quantizer is not q
    buf = io.BytesIO()
    torch.save({"t": t}, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)["t"]
    assert_same_quantized(loaded, t)
    assert copy.deepcopy(t).rowwise_data.data_ptr() != t.rowwise_data.data_ptr()


def test_quantizer_object():
    q = ft.Float8BlockQuantizer()
    assert (q.fp8_dtype, q.scaling_mode, q.rowwise, q.columnwise, q.amax_epsilon,
            q.power_2_scale) == ("e4m3", "block_1x128", True, True, 0.0, True)
    q.set_usage(columnwise=False)
    assert q(sample()).columnwise_data is None
    assert repr(pickle.loads(pickle.dumps(q))) == repr(q) == repr(q.copy()) == repr(q.to("cpu"))
    with pytest.raises(ValueError, match="both False"):
        q.set_usage(rowwise=False)
    with pytest.raises(ValueError, match="scaling_mode is 'block_64x64'"):
        ft.Float8BlockQuantizer("e4m3", "block_64x64")
    with pytest.raises(TypeError, match="amax_epsilon is True"):
        ft.Float8BlockQuantizer(amax_epsilon=True)
    with pytest.raises(TypeError, match="x has dtype torch.float64"):
        q(torch.zeros(4, dtype=torch.float64))
    with pytest.raises(TypeError, match="x is 1.0 \\(float\\)"):
        q(1.0)
    with pytest.raises(TypeError, match="was not initialised"):
        ft.Float8BlockQuantizer.__new__(ft.Float8BlockQuantizer)(sample())
    t = q(sample())
    with pytest.raises(ValueError, match="dst._data has shape"):
        q.update_quantized(sample((2, 256)), t)
    with pytest.raises(ValueError, match="dst is block_1x128 but the quantizer makes "
                                         "block_128x128"):
        ft.Float8BlockQuantizer("e4m3", "block_128x128").update_quantized(sample(), t)
    with pytest.raises(TypeError, match="expected an fp8kit Float8BlockTensor"):
        q.update_quantized(sample(), sample())


def test_quantizer_for_block_scaling():
    r = BlockScaling(fp8_format=Format.HYBRID, amax_epsilon=1e-3, power_2_scale=False)
    act = ft.quantizer_for(r)
    grad = ft.quantizer_for(r, backward=True)
    weight = ft.quantizer_for(r, weight=True, columnwise=False)
    assert (act.scaling_mode, act.fp8_dtype, act.amax_epsilon, act.power_2_scale) == (
        "block_1x128", "e4m3", 1e-3, False)
    assert (grad.scaling_mode, grad.fp8_dtype) == ("block_1x128", "e5m2")
    assert (weight.scaling_mode, weight.columnwise) == ("block_128x128", False)
    with pytest.raises(ValueError, match="a weight is a forward tensor"):
        ft.quantizer_for(r, backward=True, weight=True)


def test_constructor_checks():
    d, s, cw, cws = ft.quantize_block(sample(), "e4m3", "block_1x128", True, True)
    kw = {"dtype": torch.bfloat16, "scaling_mode": "block_1x128"}
    with pytest.raises(ValueError, match="block_scale_inv is torch.float32 of shape"):
        ft.Float8BlockTensor(d, cws, **kw)
    with pytest.raises(ValueError, match="both None"):
        ft.Float8BlockTensor(None, None, **kw)
    with pytest.raises(ValueError, match="scaling_mode is 'per_tensor'"):
        ft.Float8BlockTensor(d, s, dtype=torch.bfloat16, scaling_mode="per_tensor")
    with pytest.raises(ValueError, match="columnwise_data has shape"):
        ft.Float8BlockTensor(d, s, columnwise_data=d, columnwise_block_scale_inv=cws, **kw)
    t = ft.Float8BlockTensor(None, None, columnwise_data=cw, columnwise_block_scale_inv=cws, **kw)
    assert t.shape == (130, 256)
