"""torch.ops.fp8kit.* (the dispatcher ops that torch.compile traces):
torch.library.opcheck on each (schema, autograd registration, fake kernel,
AOT dispatch with dynamic shapes), bit equality with the pybind11 functions of
fp8kit.torch (whose numerics the other tests check against float64 /
ml_dtypes references) plus one check against that reference here, the
in-place update of delayed_scaling_update, and torch.compile(fullgraph=True)
of quantize -> gemm -> dequantize."""

import pytest
import torch

import fp8kit.torch as ft
from fp8kit.torch._ext import ext
from fp8kit.torch._fake_ops import columnwise_shape
from torch_reference import (DEVICES, assert_bits_equal, assert_fp8_equal_reference, device_of,
                             opcheck)

ops = torch.ops.fp8kit
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FP8_NAME = {E4M3: "e4m3", E5M2: "e5m2"}
def assert_absent(t: torch.Tensor, fp8_dtype: torch.dtype, device: torch.device):
    """A layout not asked for: an empty [0] tensor of the FP8 dtype."""
    assert (t.shape, t.dtype, t.device) == ((0,), fp8_dtype, device)


def scale_of(value: float, device) -> torch.Tensor:
    return torch.tensor([value], dtype=torch.float32, device=device)


def test_every_op_is_registered():
    for name in ("amax", "quantize", "quantize_current_scaling", "dequantize", "gemm",
                 "delayed_scaling_update", "columnwise_from_rowwise"):
        assert isinstance(getattr(ops, name), torch._ops.OpOverloadPacket), name


@pytest.mark.parametrize("shape", [(), (7,), (3, 5), (2, 3, 4), (0, 4)])
def test_fake_columnwise_shape_is_the_extensions(shape):
    assert tuple(columnwise_shape(shape)) == tuple(ext.columnwise_shape(list(shape)))


@pytest.mark.parametrize("device", DEVICES)
def test_amax(device):
    dev = device_of(device)
    for x in (torch.randn(8, 16, device=dev), torch.randn(3, 5, 7, device=dev).bfloat16()):
        opcheck(ops.amax.default, (x,))
        assert_bits_equal(ops.amax(x), ft.amax(x))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fp8_dtype", [E4M3, E5M2])
@pytest.mark.parametrize("rowwise,columnwise", [(True, False), (False, True), (True, True)])
def test_quantize(device, fp8_dtype, rowwise, columnwise):
    dev = device_of(device)
    torch.manual_seed(0)
    x = torch.randn(4, 6, 8, device=dev).bfloat16()
    scale = scale_of(3.5, dev)
    opcheck(ops.quantize.default, (x, scale, fp8_dtype, rowwise, columnwise))
    data, cw, scale_inv, amax = ops.quantize(x, scale, fp8_dtype, rowwise, columnwise)
    amax_out = scale_of(0.0, dev)
    want = ft.quantize(x, scale, FP8_NAME[fp8_dtype], rowwise, columnwise, amax_out=amax_out)
    for got_t, want_t in ((data, want[0]), (cw, want[1])):
        if want_t is None:
            assert_absent(got_t, fp8_dtype, dev)
        else:
            assert_bits_equal(got_t, want_t)
    assert_bits_equal(scale_inv, want[2])
    assert_bits_equal(amax, amax_out)
    if rowwise:
        assert_fp8_equal_reference(data, x, 3.5, FP8_NAME[fp8_dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rowwise,columnwise", [(True, False), (False, True), (True, True)])
def test_quantize_current_scaling(device, rowwise, columnwise):
    dev = device_of(device)
    torch.manual_seed(1)
    x = torch.randn(24, 16, device=dev)
    args = (x, E5M2, rowwise, columnwise, 1e-3, True)
    opcheck(ops.quantize_current_scaling.default, args)
    got = ops.quantize_current_scaling(*args)
    want = ft.quantize_current_scaling(x, "e5m2", rowwise, columnwise, 1e-3, True)
    for got_t, want_t in zip(got, want):
        if want_t is None:
            assert_absent(got_t, E5M2, dev)
        else:
            assert_bits_equal(got_t, want_t)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dequantize(device, out_dtype):
    dev = device_of(device)
    torch.manual_seed(2)
    x = torch.randn(2, 3, 8, device=dev)
    data, cw, _, scale_inv, _ = ft.quantize_current_scaling(x, "e4m3", True, True)
    cases = [((data, scale_inv, out_dtype), {}),
             ((cw, scale_inv, out_dtype, True), {"shape": [2, 3, 8]}),
             ((cw, scale_inv, out_dtype, True), {})]
    for args, kwargs in cases:
        opcheck(ops.dequantize.default, args, kwargs)
        assert_bits_equal(ops.dequantize(*args, **kwargs), ft.dequantize(*args, **kwargs))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(), (7,), (64, 64), (100, 257), (2, 64, 132), (0, 4)])
def test_columnwise_from_rowwise_is_the_byte_transpose(device, shape):
    """Against torch's strided copy, and equal to quantize's own columnwise
    copy; a misaligned view (offset by one byte) too."""
    dev = device_of(device)
    torch.manual_seed(5)
    x = torch.randn(shape, device=dev) * 10
    data, cw, scale_inv, _ = ops.quantize(x, scale_of(1.0, dev), E5M2, True, True)
    got = ops.columnwise_from_rowwise(data)
    assert_bits_equal(got, cw)
    assert_bits_equal(ft.columnwise_from_rowwise(data), cw)
    opcheck(ops.columnwise_from_rowwise.default, (data,))
    bytes_ = torch.randint(0, 256, (1 + 96 * 68,), dtype=torch.uint8, device=dev)
    view = bytes_[1:].view(E4M3).reshape(96, 68)
    want = view.view(torch.uint8).t().contiguous().view(E4M3)
    assert_bits_equal(ops.columnwise_from_rowwise(view), want)


def _gemm_operands(dev, trans_a, trans_b, m=16, k=32, n=24):
    torch.manual_seed(3)
    a = torch.randn((k, m) if trans_a else (m, k), device=dev)
    b = torch.randn((n, k) if trans_b else (k, n), device=dev)
    ad, acw, _, asi, _ = ft.quantize_current_scaling(a, "e4m3", True, True)
    bd, bcw, _, bsi, _ = ft.quantize_current_scaling(b, "e5m2", True, True)
    return ad, asi, acw, bd, bsi, bcw


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("trans_a,trans_b", [(False, True), (False, False), (True, True)])
def test_gemm(device, trans_a, trans_b):
    dev = device_of(device)
    ad, asi, acw, bd, bsi, bcw = _gemm_operands(dev, trans_a, trans_b)
    bias = torch.randn(24, device=dev).bfloat16()
    # Both layouts, then only the copy the (TN-only) CPU reference reads.
    only_a_cw, only_b_cw = trans_a, not trans_b
    operand_sets = [(ad, asi, acw, bd, bsi, bcw),
                    (None if only_a_cw else ad, asi, acw if only_a_cw else None,
                     None if only_b_cw else bd, bsi, bcw if only_b_cw else None)]
    for operands in operand_sets:
        for out_dtype, b_arg in ((torch.float32, None), (torch.bfloat16, bias)):
            args = operands + (trans_a, trans_b, out_dtype, b_arg, False, True, None)
            opcheck(ops.gemm.default, args)
            want = ft.gemm(*operands, trans_a, trans_b, out_dtype, b_arg)
            assert_bits_equal(ops.gemm(*args), want)


def test_gemm_fp8_output_with_d_scale():
    ad, asi, acw, bd, bsi, bcw = _gemm_operands("cpu", False, True, n=32)
    d_scale = scale_of(0.25, "cpu")
    args = (ad, asi, None, bd, bsi, None, False, True, E4M3, None, False, True, d_scale)
    opcheck(ops.gemm.default, args)
    want = ft.gemm(ad, asi, None, bd, bsi, None, False, True, E4M3, d_scale=d_scale)
    assert_bits_equal(ops.gemm(*args), want)


def _delayed_state(dev, n=3, amax_history_len=4):
    torch.manual_seed(4)
    return ([torch.rand(amax_history_len, device=dev) * 10 for _ in range(n)],
            [torch.rand(1, device=dev) * 20 for _ in range(n)],
            [torch.ones(1, device=dev) for _ in range(n)],
            [torch.ones(1, device=dev) for _ in range(n)])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("amax_reduction", ["max", "most_recent"])
def test_delayed_scaling_update_mutates_its_state(device, amax_reduction):
    dev = device_of(device)
    fp8_dtypes = ["e4m3", "e5m2", "e4m3"]
    state = _delayed_state(dev)
    want = tuple([t.clone() for t in ts] for ts in state)
    before = tuple([t.clone() for t in ts] for ts in state)
    opcheck(ops.delayed_scaling_update.default,
                          tuple([t.clone() for t in ts] for ts in state)
                          + (fp8_dtypes, 1, amax_reduction))
    assert ops.delayed_scaling_update(*state, fp8_dtypes, 1, amax_reduction) is None
    ft.delayed_scaling_update(*want, fp8_dtypes, 1, amax_reduction)
    for got_ts, want_ts, before_ts, mutated in zip(state, want, before,
                                                   (True, False, True, True)):
        for got_t, want_t, before_t in zip(got_ts, want_ts, before_ts):
            assert_bits_equal(got_t, want_t)
            assert torch.equal(got_t, before_t) != mutated


def test_schema_declares_the_mutated_state():
    schema = ops.delayed_scaling_update.default._schema
    mutated = [a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write]
    assert mutated == ["amax_histories", "scales", "scale_invs"]
    for op in (ops.amax, ops.quantize, ops.quantize_current_scaling, ops.dequantize, ops.gemm):
        assert not op.default._schema.is_mutable, op


def test_bad_arguments_name_the_argument_and_the_fix():
    x = torch.randn(4, 8)
    with pytest.raises(TypeError, match=r"fp8kit::quantize: fp8_dtype is .*float8_e4m3fn"):
        ops.quantize(x, scale_of(1.0, "cpu"), torch.float32, True, False)
    with pytest.raises(ValueError, match="rowwise and columnwise are both False"):
        ops.quantize_current_scaling(x, E4M3, False, False)
    data, _, _, scale_inv, _ = ft.quantize_current_scaling(x, "e4m3")
    b3 = data.reshape(2, 2, 8)
    with pytest.raises(ValueError, match=r"fp8kit::gemm: b has shape \[2, 2, 8\]; b is one 2-D"):
        ops.gemm(data, scale_inv, None, b3, scale_inv, None, False, True, torch.float32)
    with pytest.raises(ValueError, match="fp8kit::gemm: a and a_columnwise are both None"):
        ops.gemm(None, scale_inv, None, data, scale_inv, None, False, True, torch.float32)
    with pytest.raises(TypeError, match="fp8kit::columnwise_from_rowwise: data has dtype torch.float32; expected FP8"):
        ops.columnwise_from_rowwise(x)
    with pytest.raises(ValueError, match="fp8kit::delayed_scaling_update: margin is -1"):
        ops.delayed_scaling_update(*_delayed_state("cpu", n=1), ["e4m3"], -1)


def _fp8_linear(x, w, w_scale, bias):
    """quantize -> gemm -> dequantize through the dispatcher ops."""
    x_data, _, _, x_scale_inv, _ = ops.quantize_current_scaling(x, E4M3, True, False)
    w_data, _, w_scale_inv, _ = ops.quantize(w, w_scale, E4M3, True, False)
    y = ops.gemm(x_data, x_scale_inv, None, w_data, w_scale_inv, None, False, True,
                 torch.bfloat16, bias)
    y_data, _, _, y_scale_inv, _ = ops.quantize_current_scaling(y, E5M2, True, False)
    return ops.dequantize(y_data, y_scale_inv, torch.float32)


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_compile_fullgraph_matches_eager(backend):
    torch.manual_seed(5)
    inputs = (torch.randn(16, 32).bfloat16(), torch.randn(24, 32).bfloat16(),
              scale_of(4.0, "cpu"), torch.randn(24).bfloat16())
    want = _fp8_linear(*inputs)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(_fp8_linear)(*inputs)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    torch._dynamo.reset()
    got = torch.compile(_fp8_linear, fullgraph=True, backend=backend)(*inputs)
    assert_bits_equal(got, want)
    # ... and the eager dispatcher path equals the pybind11 path.
    xd, _, _, xsi, _ = ft.quantize_current_scaling(inputs[0], "e4m3")
    wd, _, wsi = ft.quantize(inputs[1], inputs[2], "e4m3")
    y = ft.gemm(xd, xsi, None, wd, wsi, None, False, True, torch.bfloat16, inputs[3])
    yd, _, _, ysi, _ = ft.quantize_current_scaling(y, "e5m2")
    assert_bits_equal(want, ft.dequantize(yd, ysi, torch.float32))
