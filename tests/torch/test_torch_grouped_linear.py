"""fp8kit.torch.GroupedLinear: against fp8kit's own Linear run expert by
expert (bit-identical outputs and gradients), against high precision
within FP8's error, empty and single experts, bad counts, the dispatcher
ops under opcheck, and torch.compile with no graph break."""

import copy

import pytest
import torch
import torch._dynamo.testing
import torch.nn.functional as F

from compile_helpers import fresh_dynamo  # noqa: F401  (autouse fixture)
from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling
from fp8kit.torch import GroupedLinear, Linear, autocast
from test_torch_dispatcher_ops import opcheck
from torch_reference import DEVICES, assert_bits_equal, device_of

RECIPE = CurrentScaling()


def make(experts, k, n, dtype=torch.float32, bias=True, device="cpu", seed=0):
    torch.manual_seed(seed)
    return GroupedLinear(experts, k, n, bias=bias, dtype=dtype, device=device)


def inputs(sizes, k, n, dtype=torch.float32, device="cpu", seed=1):
    g = torch.Generator().manual_seed(seed)
    tokens = sum(sizes)
    x = (torch.randn(tokens, k, generator=g) * 2).to(dtype).to(device).requires_grad_()
    dy = torch.randn(tokens, n, generator=g).to(dtype).to(device)
    return x, dy


def run(layer, x, dy, sizes, recipe=RECIPE):
    x = x.detach().requires_grad_()
    layer.zero_grad(set_to_none=True)
    with autocast(recipe=recipe):
        y = layer(x, sizes)
    y.backward(dy)
    return y.detach(), x.grad, layer.weight.grad, None if layer.bias is None else layer.bias.grad


def per_expert_linears(layer, x, dy, sizes, recipe=RECIPE):
    """The same computation through one fp8kit.torch.Linear per expert."""
    ys, dxs, dws, dbs = [], [], [], []
    for e, (xe, dye) in enumerate(zip(torch.split(x.detach(), sizes),
                                      torch.split(dy, sizes))):
        lin = Linear(layer.in_features, layer.out_features, bias=layer.bias is not None,
                     dtype=x.dtype, device=x.device)
        with torch.no_grad():
            lin.weight.copy_(layer.weight[e])
            if layer.bias is not None:
                lin.bias.copy_(layer.bias[e])
        xe = xe.clone().requires_grad_()
        with autocast(recipe=recipe):
            ye = lin(xe)
        ye.backward(dye)
        ys.append(ye.detach())
        dxs.append(xe.grad)
        dws.append(lin.weight.grad)
        dbs.append(None if lin.bias is None else lin.bias.grad)
    db = None if layer.bias is None else torch.stack(dbs)
    return torch.cat(ys), torch.cat(dxs), torch.stack(dws), db


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sizes", [[5, 0, 37, 16], [64], [0, 0, 9], [16, 16, 16, 16]])
def test_equals_one_linear_per_expert(device, dtype, sizes):
    dev = device_of(device)
    layer = make(len(sizes), 32, 48, dtype=dtype, device=dev)
    x, dy = inputs(sizes, 32, 48, dtype, dev)
    y, dx, dw, db = run(layer, x, dy, sizes)
    ref_y, ref_dx, ref_dw, ref_db = per_expert_linears(layer, x, dy, sizes)
    assert_bits_equal(y, ref_y)
    assert_bits_equal(dx, ref_dx)
    assert_bits_equal(dw, ref_dw)
    # The bias gradient is a float32 sum of dy per expert in both, in
    # another order (Linear takes it from its cast's column sums).
    torch.testing.assert_close(db.float(), ref_db.float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_close_to_high_precision(device):
    dev = device_of(device)
    sizes = [40, 3, 0, 21]
    layer = make(4, 64, 32, device=dev)
    x, dy = inputs(sizes, 64, 32, device=dev)
    y, dx, dw, db = run(layer, x, dy, sizes)
    ry, rdx, rdw, rdb = _high(copy.deepcopy(layer), x, dy, sizes)
    for got, want in ((y, ry), (dx, rdx), (dw, rdw)):
        err = (got - want).norm() / want.norm()
        assert err < 0.08, err
    torch.testing.assert_close(db, rdb, rtol=1e-5, atol=1e-5)
    assert torch.all(dw[2] == 0), "an expert with no tokens gets a zero weight gradient"


def _high(layer, x, dy, sizes):
    x = x.detach().requires_grad_()
    layer.zero_grad(set_to_none=True)
    y = layer(x, sizes)  # outside autocast: high precision
    y.backward(dy)
    return y.detach(), x.grad, layer.weight.grad, layer.bias.grad


def test_high_precision_is_the_per_expert_matmul():
    sizes = [3, 0, 5]
    layer = make(3, 16, 16)
    x, _ = inputs(sizes, 16, 16)
    y = layer(x, torch.tensor(sizes))
    want = torch.cat([F.linear(part, layer.weight[e], layer.bias[e])
                      for e, part in enumerate(torch.split(x, sizes))])
    torch.testing.assert_close(y, want)


def test_counts_on_the_host_or_as_a_tensor_agree():
    sizes = [7, 9, 0]
    layer = make(3, 16, 32)
    x, dy = inputs(sizes, 16, 32)
    a = run(layer, x, dy, sizes)
    b = run(layer, x, dy, torch.tensor(sizes, dtype=torch.int32))
    for got, want in zip(a, b):
        assert_bits_equal(got, want)


def test_leading_dimensions_are_tokens():
    layer = make(2, 16, 16)
    x = torch.randn(2, 5, 16)
    with autocast(recipe=RECIPE):
        y = layer(x, [4, 6])
        flat = layer(x.reshape(10, 16), [4, 6])
    assert y.shape == (2, 5, 16)
    assert_bits_equal(y.reshape(10, 16), flat)


def test_inference_keeps_no_graph():
    layer = make(2, 16, 16)
    with torch.no_grad(), autocast(recipe=RECIPE):
        y = layer(torch.randn(8, 16), [3, 5])
    assert y.grad_fn is None


@pytest.mark.parametrize("sizes, match", [
    ([3, 4], "sum to 7 but the input has 8 rows"),
    ([-1, 9], "group_sizes\\[0\\] is -1"),
])
def test_counts_that_do_not_fit_the_tokens_are_refused(sizes, match):
    layer = make(2, 16, 16)
    with autocast(recipe=RECIPE), pytest.raises(ValueError, match=match):
        layer(torch.randn(8, 16), sizes)


@pytest.mark.parametrize("sizes, error, match", [
    ([1, 2, 5], ValueError, "shape \\[3\\] but the layer has 2 experts"),
    (torch.tensor([4.0, 4.0]), TypeError, "torch.float32"),
    ("4,4", TypeError, "list of ints or an int64 tensor"),
    ([4.0, 4], TypeError, "must hold ints"),
])
def test_bad_counts_name_the_argument(sizes, error, match):
    layer = make(2, 16, 16)
    with pytest.raises(error, match=match):
        layer(torch.randn(8, 16), sizes)


def test_bad_inputs_and_recipes_are_refused():
    layer = make(2, 16, 16)
    with pytest.raises(ValueError, match="takes 16 features"):
        layer(torch.randn(8, 12), [4, 4])
    with pytest.raises(TypeError, match="torch.int64"):
        layer(torch.ones(8, 16, dtype=torch.int64), [4, 4])
    for recipe in (DelayedScaling(), BlockScaling()):
        with autocast(recipe=recipe), pytest.raises(NotImplementedError, match="CurrentScaling"):
            layer(torch.randn(8, 16), [4, 4])
    odd = make(2, 24, 16)
    with autocast(recipe=RECIPE), pytest.raises(ValueError, match="in_features is 24"):
        odd(torch.randn(8, 24), [4, 4])
    with pytest.raises(ValueError, match="num_experts is 0"):
        GroupedLinear(0, 16, 16)


def test_dispatcher_ops_pass_opcheck():
    ops = torch.ops.fp8kit
    sizes = torch.tensor([5, 0, 11])
    x = torch.randn(16, 32)
    opcheck(ops.grouped_quantize.default, (x, sizes, torch.float8_e4m3fn, True, True))
    data, cw, _, sinv, _ = ops.grouped_quantize(x, sizes, torch.float8_e4m3fn, True, True)
    w = torch.randn(3 * 16, 32)
    w_sizes = torch.full((3,), 16)
    wd, wcw, _, wsinv, _ = ops.grouped_quantize(w, w_sizes, torch.float8_e4m3fn, True, True)
    opcheck(ops.grouped_gemm_tokens.default, (data, sinv, wd.view(3, 16, 32), None, wsinv, sizes, True,
                                      torch.float32))
    opcheck(ops.grouped_gemm_contract.default, (cw, sinv, cw, sinv, sizes, 16, torch.float32))
    scale = torch.ones(3, 4)
    opcheck(ops.grouped_quantize.default, (x, sizes, torch.float8_e5m2, False, True, scale))


def test_compiles_with_no_graph_break():
    sizes = torch.tensor([5, 0, 27])
    layer = make(3, 32, 16)
    compiled = copy.deepcopy(layer)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    fn = torch.compile(compiled, backend=counter, fullgraph=True)
    x, dy = inputs([5, 0, 27], 32, 16)
    want = run(layer, x, dy, sizes)
    got = run_compiled(fn, compiled, x, dy, sizes)
    for g, w in zip(got, want):
        assert_bits_equal(g, w)
    assert counter.frame_count == 1


def run_compiled(fn, module, x, dy, sizes):
    x = x.detach().requires_grad_()
    module.zero_grad(set_to_none=True)
    with autocast(recipe=RECIPE):
        y = fn(x, sizes)
    y.backward(dy)
    return y.detach(), x.grad, module.weight.grad, module.bias.grad


@pytest.mark.gpu
def test_cuda_matches_cpu_and_reads_counts_from_the_device():
    dev = device_of("cuda")
    sizes = [100, 0, 333, 64, 7]
    layer = make(5, 256, 128, dtype=torch.bfloat16)
    x, dy = inputs(sizes, 256, 128, torch.bfloat16)
    cpu = run(layer, x, dy, sizes)
    gpu_layer = copy.deepcopy(layer).to(dev)
    gpu = run(gpu_layer, x.to(dev), dy.to(dev), torch.tensor(sizes, device=dev))
    for got, want in zip(gpu, cpu):
        torch.testing.assert_close(got.cpu().float(), want.float(), rtol=2e-2, atol=2e-2)
    hp = _high(copy.deepcopy(gpu_layer), x.to(dev), dy.to(dev), sizes)
    want = _high(layer, x, dy, sizes)
    torch.testing.assert_close(hp[0].cpu().float(), want[0].float(), rtol=2e-2, atol=2e-2)
