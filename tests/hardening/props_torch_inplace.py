"""Properties of in-place mutation of a Float8Tensor: every in-place path
(arithmetic, fill, copy, indexing, a view's in-place op, the foreach
family an optimizer uses, .data assignment) either updates the tensor -
both layouts it holds, re-quantized with its own scale, equal to the
reference - or raises a clear error; never a write that is silently lost
or that leaves the rowwise and columnwise copies disagreeing. Run in a
child process by test_torch_properties.py."""

import numpy as np
import torch
from hypothesis import strategies as st

import fp8_reference as ref
import fp8kit.torch as ft
from clear_errors import CLEAR_ERRORS
from fp8_strategies import arrays, moderate_f32, prop, scales_near_1
from torch_support import bits, device_or_skip, values

# name -> (what it does to a Float8Tensor f, the same on a float32 tensor)
OPS = {
    "add_": (lambda f: f.add_(0.75), lambda t: t.add_(0.75)),
    "mul_": (lambda f: f.mul_(-3.0), lambda t: t.mul_(-3.0)),
    "zero_": (lambda f: f.zero_(), lambda t: t.zero_()),
    "fill_": (lambda f: f.fill_(2.5), lambda t: t.fill_(2.5)),
    "copy_": (lambda f: f.copy_(torch.full(f.shape, -1.25, device=f.device)),
              lambda t: t.copy_(torch.full(t.shape, -1.25))),
    "setitem_row": (lambda f: f.__setitem__(0, 7.0), lambda t: t.__setitem__(0, 7.0)),
    "setitem_slice": (lambda f: f.__setitem__((slice(None), slice(None, 2)), 0.0),
                      lambda t: t.__setitem__((slice(None), slice(None, 2)), 0.0)),
    "view_add_": (lambda f: f.view(-1).add_(1.0), lambda t: t.view(-1).add_(1.0)),
    "reshape_mul_": (lambda f: f.reshape(-1).mul_(2.0), lambda t: t.reshape(-1).mul_(2.0)),
    "foreach_add_": (lambda f: torch._foreach_add_([f], 0.5),
                     lambda t: torch._foreach_add_([t], 0.5)),
    "foreach_mul_": (lambda f: torch._foreach_mul_([f], 0.5),
                     lambda t: torch._foreach_mul_([t], 0.5)),
    "data_assign": (lambda f: setattr(f, "data", torch.zeros(f.shape, device=f.device)),
                    lambda t: t.zero_()),
    "clamp_": (lambda f: f.clamp_(-1.0, 1.0), lambda t: t.clamp_(-1.0, 1.0)),
}


@prop(max_examples=60, op=st.sampled_from(sorted(OPS)), x=arrays((4, 16), moderate_f32),
      scale=scales_near_1, fmt=st.sampled_from(["e4m3", "e5m2"]))
def check_float8_tensor_inplace(device, op, x, scale, fmt):
    dev = device_or_skip(device)
    q = ft.Float8Quantizer(torch.full((1,), scale, device=dev), fmt, None, True, True)
    f = q(torch.from_numpy(x).to(dev))
    hp = f.dequantize().cpu().clone()
    on_float8, on_float32 = OPS[op]
    try:
        on_float8(f)
    except CLEAR_ERRORS:
        return  # refused: fine, nothing was half-written
    on_float32(hp)
    want = ref.quantize_bits(values(hp), scale, fmt)
    assert isinstance(f, ft.Float8Tensor) and f.fp8_dtype == fmt
    ref.assert_bits_equal(bits(f.rowwise_data), want, f"{op}: rowwise data")
    ref.assert_bits_equal(bits(f.columnwise_data), ref.columnwise_bits(want),
                          f"{op}: columnwise data")
    ref.assert_floats_equal(values(f.dequantize()),
                            ref.dequantize(want, fmt, ref.reciprocal(scale), "float32"),
                            f"{op}: dequantize()")
    assert np.float32(f.scale_inv.item()) == ref.reciprocal(scale), f"{op}: scale_inv changed"
