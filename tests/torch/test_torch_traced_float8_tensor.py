"""Float8Tensor traced: under FakeTensorMode every kind of op in its table
(dequantize, views, copies, reads, in-place writes) gives what eager mode
gives in shape, dtype and layouts; under torch.compile(fullgraph=True) a
Float8Tensor is a graph input (one graph, no break) and small functions of
its ops compute the same bits as eager mode; flatten / unflatten round
trips, views included; a Linear with an FP8 weight names what does not
trace yet.

Eager mode is the reference: test_torch_float8_tensor.py checks it against
ml_dtypes and float64 references."""

import copy

import pytest
import torch
import torch._dynamo.testing
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import fp8kit.torch as ft
from fp8kit.recipe import CurrentScaling
from fp8kit.torch import Float8Tensor
from compile_helpers import fresh_dynamo  # noqa: F401  (autouse fixture)
from torch_reference import DEVICES, assert_bits_equal, device_of



def assert_same_float8(got: Float8Tensor, want: Float8Tensor):
    """Same nominal metadata, layouts, FP8 bits and scale_inv."""
    assert (got.shape, got.dtype, got.fp8_dtype) == (want.shape, want.dtype, want.fp8_dtype)
    for g, w in ((got.rowwise_data, want.rowwise_data),
                 (got.columnwise_data, want.columnwise_data)):
        assert (g is None) == (w is None)
        if g is not None:
            assert_bits_equal(g, w)
    assert_bits_equal(got.scale_inv, want.scale_inv)


def f8(device="cpu", rowwise=True, columnwise=True, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(16, 32, generator=g) * 3).to(dtype).to(device)
    return ft.Float8CurrentScalingQuantizer("e4m3", rowwise, columnwise)(x)


# Functions of a Float8Tensor q [16, 32] and a plain x [8, 32], one per kind
# of op in the table; each result is plain. Only ops that every backend
# computes exactly (no reductions: inductor sums in another order).
READS = {
    "dequantize_mm": lambda q, x: x @ q.dequantize().t(),
    "linear": lambda q, x: F.linear(x, q),
    "mm_of_a_view": lambda q, x: torch.mm(x, q.t()),
    "slice_and_transpose": lambda q, x: x[:, :8] @ q[2:10, :8].t().dequantize(),
    "reshape": lambda q, x: q.reshape(32, 16).dequantize() * 2,
    "split": lambda q, x: q.split(8)[1].dequantize() + x,
    "detach_and_alias": lambda q, x: q.detach().dequantize() - 1,
    "clone": lambda q, x: q.clone().dequantize() + x[:1],
    "to_bfloat16": lambda q, x: q.to(torch.bfloat16).float(),
    "elementwise": lambda q, x: torch.relu(q) * 3 + q,
    "cat": lambda q, x: torch.cat([q, x]),
}
# In-place writes into q (re-quantized with its quantizer).
WRITES = {
    "add_": lambda q, x: q.add_(x[:1]),
    "copy_": lambda q, x: q.copy_(x.repeat(2, 1) * 3),
    "mul_through_a_view": lambda q, x: q[3].mul_(2),
    "fill_": lambda q, x: q.fill_(1.5),
}


# -------------------------------------------------------------- fake mode
@pytest.mark.parametrize("rowwise", [True, False])
@pytest.mark.parametrize("name", sorted(READS))
def test_reads_in_fake_mode_match_eager_metadata(name, rowwise):
    q, x = f8(rowwise=rowwise), torch.randn(8, 32)
    want = READS[name](q, x)
    mode = FakeTensorMode()
    fake_q, fake_x = mode.from_tensor(q), mode.from_tensor(x)
    assert isinstance(fake_q, Float8Tensor) and isinstance(fake_q.scale_inv, FakeTensor)
    with mode:
        got = READS[name](fake_q, fake_x)
    assert isinstance(got, FakeTensor)
    assert (got.shape, got.dtype, got.device) == (want.shape, want.dtype, want.device)


@pytest.mark.parametrize("name", sorted(WRITES))
def test_writes_in_fake_mode_keep_the_layouts(name):
    q = f8()
    mode = FakeTensorMode()
    fake_q = mode.from_tensor(q)
    with mode:
        WRITES[name](fake_q, torch.randn(8, 32))
    assert isinstance(fake_q, Float8Tensor)
    assert isinstance(fake_q.rowwise_data, FakeTensor)
    assert fake_q.columnwise_data.shape == q.columnwise_data.shape
    assert "traced" in repr(fake_q)  # no values to print, and no error


# ---------------------------------------------------------------- compile
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rowwise", [True, False])
@pytest.mark.parametrize("name", sorted(READS))
def test_compiled_reads_equal_eager(device, name, rowwise):
    dev = device_of(device)
    q, x = f8(dev, rowwise=rowwise), torch.randn(8, 32, device=dev)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    got = torch.compile(READS[name], backend=counter, fullgraph=True)(q, x)
    assert_bits_equal(got, READS[name](q, x))
    assert counter.frame_count == 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(WRITES))
def test_compiled_writes_equal_eager(device, name):
    dev = device_of(device)
    got_q, x = f8(dev), torch.randn(8, 32, device=dev)
    want_q = copy.deepcopy(got_q)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    torch.compile(WRITES[name], backend=counter, fullgraph=True)(got_q, x)
    WRITES[name](want_q, x)
    assert_same_float8(got_q, want_q)
    assert counter.frame_count == 1


@pytest.mark.parametrize("device", DEVICES)
def test_inductor_with_a_quantized_weight_as_graph_input(device):
    """A function of several table ops, compiled once by inductor, reused
    for a new weight of the same kind, no graph break."""
    dev = device_of(device)

    def mlp(x, w1, w2):
        h = torch.relu(F.linear(x, w1))
        return h @ w2.dequantize().t() + x @ w2[:, :32].t()

    def weights(seed):
        g = torch.Generator().manual_seed(seed)
        q = ft.Float8CurrentScalingQuantizer("e4m3", True, True)
        return (q(torch.randn(64, 32, generator=g).to(dev)),
                q(torch.randn(32, 64, generator=g).to(dev)))

    x = torch.randn(8, 32, device=dev)
    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    compiled = torch.compile(mlp, backend=counter, fullgraph=True)
    for seed in (1, 2):
        w1, w2 = weights(seed)
        assert_bits_equal(compiled(x, w1, w2), mlp(x, w1, w2))
    assert counter.frame_count == 1
    explained = torch._dynamo.explain(mlp)(x, *weights(3))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)


def test_a_new_layout_compiles_again():
    """What the graph depends on is guarded: a columnwise-only tensor is a
    new graph; a tensor of the same kind is not."""
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(lambda q: q.dequantize(), backend=counter, fullgraph=True)
    for q, compilations in ((f8(), 1), (f8(), 1), (f8(rowwise=False), 2)):
        assert_bits_equal(compiled(q), q.dequantize())
        assert counter.frame_count == compilations


# ----------------------------------------------------- flatten / unflatten
@pytest.mark.parametrize("view", ["none", "t", "slice"])
def test_flatten_round_trip(view):
    q = f8()
    t = {"none": q, "t": q.t(), "slice": q[4:12]}[view]
    names, meta = t.__tensor_flatten__()
    inner = {n: getattr(t, n) for n in names}
    back = Float8Tensor.__tensor_unflatten__(inner, meta, t.shape, t.stride())
    assert (back.shape, back.stride()) == (t.shape, t.stride())
    assert_bits_equal(back.dequantize(), t.dequantize())
    assert Float8Tensor.__metadata_guard__(copy.deepcopy(meta), meta)
    assert not Float8Tensor.__metadata_guard__(copy.deepcopy(meta),
                                               f8(columnwise=False).__tensor_flatten__()[1])


# ------------------------------------------------------------------ Linear
def test_linear_with_an_fp8_weight_names_what_does_not_trace():
    layer = ft.Linear(32, 16)
    layer.weight = torch.nn.Parameter(f8(), requires_grad=False)

    def forward(x):
        with ft.autocast(recipe=CurrentScaling()):
            return layer(x)

    with pytest.raises(Exception, match="does not trace under torch.compile"):
        torch.compile(forward, backend="aot_eager", fullgraph=True)(torch.randn(8, 32))
