"""Writes into a Float8Tensor are never lost or half done: optimizers
(foreach, single-tensor and fused paths), every in-place op of the op table,
indexed writes, writes through views, `.data =` and out= all give the same
bits as the op on the dequantized reference followed by re-quantization, and
the rowwise copy stays the transpose of the columnwise copy. Ops with no rule
raise instead of doing nothing."""

import re
from pathlib import Path

import pytest
import torch

import fp8kit.torch as ft
from fp8kit.torch import Float8Tensor
from fp8kit.torch import float8_tensor_ops
from torch_reference import cuda_or_skip

SHAPE = (8, 16)


def bits(t):
    return None if t is None else t.view(torch.uint8)


def f8(kind="current", shape=SHAPE, dtype=torch.float32, columnwise=True, seed=0):
    """A Float8Tensor made by a current-scaling quantizer, a delayed-scaling
    one, or the constructor without a quantizer (then its scale is kept)."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 3).to(dtype)
    if kind == "current":
        return ft.Float8CurrentScalingQuantizer("e4m3", True, columnwise)(x)
    q = ft.Float8Quantizer(torch.tensor([8.0]), "e4m3", rowwise=True, columnwise=columnwise)
    t = q(x)
    if kind == "delayed":
        return t
    return Float8Tensor(t._data, t._scale_inv, dtype=dtype, columnwise_data=t._columnwise_data)


def requantize_like(t, hp):
    """What t should hold after a write that leaves it equal to hp: hp
    quantized by t's quantizer, or with t's scale when it has none."""
    q = t.quantizer
    if q is None:
        q = ft.Float8Quantizer(torch.reciprocal(t.scale_inv), t.fp8_dtype)
    return q(hp.to(t.dtype))


def assert_consistent(t):
    """Both copies of t's owner hold the same bits."""
    root = t._root()
    if root._data is not None and root._columnwise_data is not None:
        cols, rows = ft.float8_tensor._columnwise_shape(root.shape)
        assert torch.equal(bits(root._data).reshape(rows, cols).t(), bits(root._columnwise_data))


def assert_holds(t, want):
    """t (owning its buffers) holds exactly the bits and scale of `want`."""
    assert t._owner is None
    assert_consistent(t)
    assert torch.equal(t._scale_inv, want._scale_inv)
    for mine, theirs in ((t._data, want._data), (t._columnwise_data, want._columnwise_data)):
        if mine is not None:
            assert torch.equal(bits(mine), bits(theirs))


# ------------------------------------------------------------- optimizers ----
LR, WD = 0.3, 0.1
OPTIMIZERS = {
    "sgd": lambda p, **kw: torch.optim.SGD(p, lr=0.5, **kw),
    "sgd_momentum": lambda p, **kw: torch.optim.SGD(p, lr=0.5, momentum=0.9, weight_decay=WD,
                                                    nesterov=True, **kw),
    "adam": lambda p, **kw: torch.optim.Adam(p, lr=LR, weight_decay=WD, **kw),
    "adamw": lambda p, wd=WD, **kw: torch.optim.AdamW(p, lr=LR, weight_decay=wd, amsgrad=True,
                                                      **kw),
}
PATHS = {"foreach": dict(foreach=True), "single": dict(foreach=False), "fused": dict(fused=True)}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("opt", OPTIMIZERS)
@pytest.mark.parametrize("kind", ["current", "delayed", "no_quantizer"])
def test_optimizer_step_matches_the_requantized_reference(opt, path, kind):
    check_optimizer(opt, path, f8(kind))


@pytest.mark.gpu
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("opt", ["sgd_momentum", "adamw"])
def test_optimizer_step_on_cuda_matches_the_requantized_reference(opt, path):
    check_optimizer(opt, path, f8("current").to(cuda_or_skip()))


def check_optimizer(opt, path, g):
    """Three steps of optimizer `opt` over nn.Parameter(g) give the bits of
    the same optimizer over the dequantized values, re-quantized."""
    # AdamW's foreach and single-tensor paths write the parameter twice (the
    # decay p *= 1 - lr * wd, then the Adam update), so it is re-quantized
    # after each; the reference does the decay itself, then a step without it.
    decay_apart = opt == "adamw" and path != "fused"
    p = torch.nn.Parameter(g)
    ref = torch.nn.Parameter(g.dequantize().clone())
    o = OPTIMIZERS[opt]([p], **PATHS[path])
    o_ref = OPTIMIZERS[opt]([ref], **PATHS[path], **(dict(wd=0.0) if decay_apart else {}))
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        grad = torch.randn(SHAPE, generator=gen).to(g.device)
        p.grad, ref.grad = grad.clone(), grad.clone()
        before = g.dequantize().clone()
        o.step()
        if decay_apart:
            with torch.no_grad():
                ref.mul_(1 - LR * WD)
                ref.copy_(requantize_like(g, ref.detach()).dequantize())
        o_ref.step()
        want = requantize_like(g, ref.detach())
        assert_holds(g, want)
        assert not torch.equal(g.dequantize(), before)   # the step was not lost
        with torch.no_grad():                             # the reference continues from
            ref.copy_(want.dequantize())                  # the re-quantized values


def test_foreach_over_mixed_lists_writes_every_tensor():
    a, b = f8(seed=1), f8("delayed", seed=2)
    plain = torch.randn(SHAPE)
    ha, hb, hplain = a.dequantize(), b.dequantize(), plain.clone()
    torch._foreach_add_([a, plain, b], [plain, a, torch.ones(SHAPE)], alpha=2)
    assert_holds(a, requantize_like(a, ha + 2 * hplain))
    assert torch.equal(plain, hplain + 2 * ha)
    assert_holds(b, requantize_like(b, hb + 2))


def _optimizer_in_place_ops():
    """Every in-place foreach / fused op torch.optim's SGD, Adam and AdamW
    call, read from the installed torch's sources."""
    root = Path(torch.optim.__file__).parent
    src = "".join((root / f).read_text() for f in ("sgd.py", "adam.py", "adamw.py"))
    return sorted(set(re.findall(r"torch\.(_(?:foreach|fused)_\w+_)\(", src)))


def test_the_table_lists_every_in_place_op_the_optimizers_use():
    names = _optimizer_in_place_ops()
    assert "_foreach_add_" in names and "_foreach_addcdiv_" in names
    missing = [n for n in names if n not in float8_tensor_ops.IN_PLACE]
    assert not missing, f"add these to the op table: {missing}"
    table = ft.Float8Tensor._OP_TABLE
    for name in float8_tensor_ops.IN_PLACE:
        packet = getattr(torch.ops.aten, name)
        for overload in packet.overloads():
            assert getattr(packet, overload) in table, f"{name}.{overload}"


# --------------------------------------------------------- in-place ops ----
def _idx():
    return torch.tensor([1, 5, 6])


def _mask():
    return torch.arange(SHAPE[0] * SHAPE[1]).reshape(SHAPE) % 3 == 0


OTHER = torch.linspace(-2, 2, SHAPE[0] * SHAPE[1]).reshape(SHAPE)
IN_PLACE_CASES = {
    "add_": lambda t: t.add_(OTHER, alpha=0.5),
    "add_scalar": lambda t: t.add_(1.25),
    "sub_": lambda t: t.sub_(OTHER),
    "mul_": lambda t: t.mul_(OTHER),
    "div_": lambda t: t.div_(4.0),
    "addcmul_": lambda t: t.addcmul_(OTHER, OTHER, value=0.5),
    "addcdiv_": lambda t: t.addcdiv_(OTHER, OTHER.abs() + 1, value=-2),
    "lerp_": lambda t: t.lerp_(OTHER, 0.25),
    "clamp_": lambda t: t.clamp_(-1, 1),
    "neg_": lambda t: t.neg_(),
    "abs_": lambda t: t.abs_(),
    "sigmoid_": lambda t: t.sigmoid_(),
    "fill_": lambda t: t.fill_(0.75),
    "zero_": lambda t: t.zero_(),
    "masked_fill_": lambda t: t.masked_fill_(_mask(), 3.0),
    "index_put_": lambda t: t.index_put_((_idx(),), torch.tensor(2.0)),
    "index_fill_": lambda t: t.index_fill_(1, _idx(), -1.0),
    "index_copy_": lambda t: t.index_copy_(0, _idx(), OTHER[:3]),
    "index_add_": lambda t: t.index_add_(0, _idx(), OTHER[:3]),
    "scatter_": lambda t: t.scatter_(1, torch.arange(16).flip(0).expand(SHAPE), OTHER),
    "copy_": lambda t: t.copy_(OTHER * 3),
    "uniform_": lambda t: t.uniform_(-1, 1, generator=torch.Generator().manual_seed(3)),
    "setitem_row": lambda t: t.__setitem__(0, 7.0),
    "setitem_slice": lambda t: t.__setitem__((slice(None), slice(None, 4)), 0.0),
    "setitem_mask": lambda t: t.__setitem__(_mask(), OTHER[_mask()]),
    "setitem_index": lambda t: t.__setitem__(_idx(), OTHER[:3]),
    "setitem_step": lambda t: t.__setitem__((slice(1, None, 3), 2), -5.0),
    "foreach_add_": lambda t: torch._foreach_add_([t], [OTHER], alpha=-1),
    "foreach_mul_": lambda t: torch._foreach_mul_([t], 0.5),
    "foreach_addcmul_": lambda t: torch._foreach_addcmul_([t], [OTHER], [OTHER], value=2),
    "foreach_addcdiv_": lambda t: torch._foreach_addcdiv_([t], [OTHER], [OTHER.abs() + 1], [3.0]),
    "foreach_lerp_": lambda t: torch._foreach_lerp_([t], [OTHER], 0.5),
    "foreach_copy_": lambda t: torch._foreach_copy_([t], [OTHER]),
    "foreach_sub_": lambda t: torch._foreach_sub_([t], [OTHER]),
    "foreach_div_": lambda t: torch._foreach_div_([t], 2.0),
    "foreach_zero_": lambda t: torch._foreach_zero_([t]),
    "foreach_maximum_": lambda t: torch._foreach_maximum_([t], [OTHER]),
    "foreach_neg_": lambda t: torch._foreach_neg_([t]),
}


@pytest.mark.parametrize("case", IN_PLACE_CASES)
@pytest.mark.parametrize("kind", ["current", "delayed"])
def test_in_place_op_matches_the_requantized_reference(case, kind):
    t = f8(kind)
    ptrs = (t._data.data_ptr(), t._columnwise_data.data_ptr())
    ref = t.dequantize()
    IN_PLACE_CASES[case](ref)
    out = IN_PLACE_CASES[case](t)
    assert out is t or out is None or (type(out) is list and out[0] is t)   # foreach: [t]
    assert (t._data.data_ptr(), t._columnwise_data.data_ptr()) == ptrs   # written in place
    assert_holds(t, requantize_like(t, ref))


def test_in_place_on_a_columnwise_only_tensor():
    t = f8(columnwise=True)
    t.update_usage(rowwise=False)
    ref = t.dequantize()
    t[2:4] = 1.5
    ref[2:4] = 1.5
    assert t._data is None
    want = requantize_like(t, ref)
    assert torch.equal(bits(t._columnwise_data), bits(want._columnwise_data))


@pytest.mark.filterwarnings("ignore:An output with one or more elements was resized")
def test_out_argument_requantizes_and_refuses_a_resize():
    t = f8("delayed")
    x = torch.randn(SHAPE)
    assert torch.mul(x, 2, out=t) is t
    assert_holds(t, requantize_like(t, x * 2))
    before = bits(t._data).clone()
    with pytest.raises(ValueError, match="would resize"):
        torch.add(torch.randn(2, 2), 1, out=t)
    assert torch.equal(bits(t._data), before)


@pytest.mark.parametrize("op", [
    lambda t: t.t_(), lambda t: t.unsqueeze_(0), lambda t: t.resize_(4, 4),
    lambda t: t.cumsum_(0), lambda t: t.set_(torch.zeros(SHAPE)),
    lambda t: torch.cat([torch.zeros(4, 16), torch.zeros(4, 16)], out=t),
])
def test_in_place_op_without_a_rule_raises_and_changes_nothing(op):
    t = f8()
    before = (bits(t._data).clone(), bits(t._columnwise_data).clone(), t.shape)
    with pytest.raises(NotImplementedError, match="no rule|writes into a Float8Tensor"):
        op(t)
    assert t.shape == before[2]
    assert torch.equal(bits(t._data), before[0])
    assert torch.equal(bits(t._columnwise_data), before[1])


def test_in_place_on_a_leaf_that_requires_grad_raises_as_in_torch():
    t = f8()
    t.requires_grad = True
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        t.add_(1)
    with torch.no_grad():
        t.add_(1)                                        # the optimizers' way


# ------------------------------------------------------------------ views ----
VIEWS = {
    "view": lambda t: t.view(-1),
    "view_new_last_dim": lambda t: t.view(4, 32),
    "reshape": lambda t: t.reshape(2, 4, 16),
    "flatten": lambda t: t.flatten(),
    "unsqueeze": lambda t: t.unsqueeze(0),
    "t": lambda t: t.t(),
    "transpose": lambda t: t.transpose(0, 1),
    "slice_rows": lambda t: t[2:5],
    "slice_cols": lambda t: t[:, 3:9],
    "select": lambda t: t[3],
    "narrow": lambda t: t.narrow(1, 2, 5),
    "as_strided": lambda t: t.as_strided((4, 4), (16, 2), 3),
    "diagonal": lambda t: t.diagonal(),
    "split": lambda t: t.split(3)[1],
    "unbind": lambda t: t.unbind(1)[5],
    "view_of_view": lambda t: t.t()[2:6].transpose(0, 1)[::2, 1:].unsqueeze(1),
    "detach": lambda t: t.detach(),
    "data": lambda t: t.data,
    "view_as": lambda t: t.view_as(torch.empty(SHAPE)),
}
WRITES = {
    "add_": lambda v: v.add_(1.5),
    "mul_": lambda v: v.mul_(-2),
    "fill_": lambda v: v.fill_(0.25),
    "copy_": lambda v: v.copy_(torch.full(v.shape, 3.0)),
    "foreach_add_": lambda v: torch._foreach_add_([v], 1.0),
}


@pytest.mark.parametrize("write", WRITES)
@pytest.mark.parametrize("view", VIEWS)
def test_writes_through_views_update_every_copy(view, write):
    t = f8("delayed")
    ref = t.dequantize()
    v = VIEWS[view](t)
    assert isinstance(v, Float8Tensor) and v._root() is t
    assert torch.equal(v.dequantize(), VIEWS[view](ref))
    WRITES[write](VIEWS[view](ref))
    WRITES[write](v)
    want = requantize_like(t, ref)
    assert_holds(t, want)
    assert torch.equal(v.dequantize(), VIEWS[view](want.dequantize()))  # reads the new bits


@pytest.mark.parametrize("view", VIEWS)
def test_views_read_writes_made_to_the_tensor(view):
    t = f8("current")
    v = VIEWS[view](t)
    t.mul_(3)                                           # new bits and a new scale
    assert torch.equal(v.dequantize(), VIEWS[view](t.dequantize()))
    t.update_usage(rowwise=False)                       # and a changed set of copies
    assert torch.equal(v.dequantize(), VIEWS[view](t.dequantize()))


def test_views_alias_the_layouts_they_share():
    t = f8(shape=(4, 6, 16))
    v = t.view(24, 16)
    assert v.rowwise_data.data_ptr() == t._data.data_ptr()
    assert v.columnwise_data.data_ptr() == t._columnwise_data.data_ptr()
    assert v.stride() == (16, 1) and t[1:3].storage_offset() == 96
    assert not t.view(24, 16).t().is_contiguous()
    c = t[1:3].clone()                                  # a copy owns its buffers
    assert c._owner is None and c.is_contiguous()
    assert torch.equal(c.dequantize(), t.dequantize()[1:3])
    assert_consistent(c)


def test_update_usage_on_a_view_changes_its_owner():
    t = f8(columnwise=False)
    p = torch.nn.Parameter(t)
    assert p._root() is t
    p.update_usage(columnwise=True)
    assert t._columnwise_data is not None
    assert_consistent(t)


def test_view_op_that_reinterprets_the_dtype_raises():
    t = f8()
    with pytest.raises(TypeError, match="reinterpret"):
        t.view(torch.int32)


def test_write_through_an_expanded_view_raises_as_in_torch():
    t = f8(shape=(1, 16))
    with pytest.raises(RuntimeError, match="single memory location"):
        t.expand(4, 16).add_(1)


def test_views_copy_pickle_and_deepcopy_as_tensors_of_their_own():
    import copy
    import pickle
    t = f8()
    v = t[2:6].t()
    for c in (copy.deepcopy(v), pickle.loads(pickle.dumps(v)), v.to("cpu", copy=True)):
        assert c._owner is None and c.shape == (16, 4)
        assert torch.equal(c.dequantize(), v.dequantize())
        assert_consistent(c)
    assert "view of shape (8, 16)" in repr(v)


# ------------------------------------------------------------ .data = x ----
def test_data_assignment_requantizes():
    t = f8("delayed")
    x = torch.randn(SHAPE)
    t.data = x
    assert_holds(t, requantize_like(t, x))
    other = f8("delayed", seed=5)
    t.data = other                                      # same format: the bits are copied
    assert_holds(t, other)


def test_data_assignment_through_a_parameter_reaches_the_tensor():
    t = f8("current")
    p = torch.nn.Parameter(t)
    x = torch.randn(SHAPE)
    p.data = x
    assert_holds(t, requantize_like(t, x))


@pytest.mark.parametrize("value, err, msg", [
    (torch.zeros(4, 4), ValueError, "needs its shape"),
    ("zeros", TypeError, "must be a torch.Tensor"),
])
def test_data_assignment_refuses_what_it_cannot_requantize(value, err, msg):
    t = f8()
    before = bits(t._data).clone()
    with pytest.raises(err, match=msg):
        t.data = value
    assert torch.equal(bits(t._data), before)


def test_state_dict_round_trip_into_a_parameter_is_bit_exact():
    import io
    m = torch.nn.Module()
    m.w = torch.nn.Parameter(f8("delayed", seed=3))
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    want = m.w.clone()
    with torch.no_grad():
        m.w.quantizer.scale.fill_(2.0)                  # delayed scaling moved on,
        m.w.mul_(0.1)                                   # and so did the parameter
    buf.seek(0)
    m.load_state_dict(torch.load(buf, weights_only=True))
    assert_holds(m.w._root(), want)                     # the saved bits and scale
