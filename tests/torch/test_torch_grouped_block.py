"""fp8kit.torch.GroupedLinear under BlockScaling: bit-identical to
fp8kit.torch.Linear under BlockScaling run on each expert's tokens (no
bias; with a bias, close to it), close to high precision, the padded row
layout's indices, the block-scaled grouped ops under opcheck, the fake
kernels' scale sizes against the core's rule, and torch.compile."""

import copy

import pytest
import torch
import torch._dynamo.testing

from compile_helpers import fresh_dynamo  # noqa: F401  (autouse fixture)
from fp8kit.recipe import BlockScaling
from fp8kit.torch import GroupedLinear, Linear, autocast
from fp8kit.torch._ext import ext
from fp8kit.torch._grouped_block import padded_rows
from fp8kit.torch._grouped_block_fake_ops import block_scales_floats
from torch_reference import DEVICES, assert_bits_equal, device_of, opcheck

RECIPE = BlockScaling()


def make(experts, k, n, dtype=torch.float32, bias=False, device="cpu"):
    torch.manual_seed(0)
    return GroupedLinear(experts, k, n, bias=bias, dtype=dtype, device=device)


def inputs(sizes, k, n, dtype, device, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(sum(sizes), k, generator=g) * 3).to(dtype).to(device)
    dy = torch.randn(sum(sizes), n, generator=g).to(dtype).to(device)
    return x, dy


def run(layer, x, dy, sizes, recipe=RECIPE):
    x = x.detach().requires_grad_()
    layer.zero_grad(set_to_none=True)
    with autocast(recipe=recipe):
        y = layer(x, sizes)
    y.backward(dy)
    grads = [x.grad, layer.weight.grad] + ([layer.bias.grad] if layer.bias is not None else [])
    return [y.detach()] + grads


def per_expert(layer, x, dy, sizes):
    outs = [[], [], []]
    for e, (xe, dye) in enumerate(zip(torch.split(x, sizes), torch.split(dy, sizes))):
        lin = Linear(layer.in_features, layer.out_features, bias=False, dtype=x.dtype,
                     device=x.device)
        with torch.no_grad():
            lin.weight.copy_(layer.weight[e])
        xe = xe.detach().clone().requires_grad_()
        with autocast(recipe=RECIPE):
            ye = lin(xe)
        ye.backward(dye)
        for out, t in zip(outs, (ye.detach(), xe.grad, lin.weight.grad)):
            out.append(t)
    return [torch.cat(outs[0]), torch.cat(outs[1]), torch.stack(outs[2])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sizes", [[5, 0, 130, 16], [1], [0, 37]])
def test_equals_one_block_linear_per_expert(device, dtype, sizes):
    dev = device_of(device)
    layer = make(len(sizes), 256, 128, dtype, device=dev)
    x, dy = inputs(sizes, 256, 128, dtype, dev)
    for got, want in zip(run(layer, x, dy, sizes), per_expert(layer, x, dy, sizes)):
        assert_bits_equal(got, want)


def test_bias_and_high_precision():
    sizes = [40, 0, 21]
    layer = make(3, 128, 64, bias=True)
    x, dy = inputs(sizes, 128, 64, torch.float32, "cpu")
    y, dx, dw, db = run(layer, x, dy, sizes)
    ry, rdx, rdw, rdb = run(copy.deepcopy(layer), x, dy, sizes, recipe=None)
    for got, want in ((y, ry), (dx, rdx), (dw, rdw)):
        assert ((got - want).norm() / want.norm()) < 0.08
    torch.testing.assert_close(db, rdb, rtol=1e-5, atol=1e-5)
    assert torch.all(dw[1] == 0)


def test_padded_rows_start_each_expert_at_a_multiple_of_16():
    sizes = torch.tensor([5, 0, 16, 17, 2])
    rows = padded_rows(sizes, 40, "cpu").tolist()
    assert rows == list(range(5)) + list(range(16, 32)) + list(range(32, 49)) + [64, 65]


@pytest.mark.parametrize("mode", ["block_1x128", "block_128x128"])
@pytest.mark.parametrize("columnwise", [False, True])
def test_fake_scale_sizes_follow_the_core(mode, columnwise):
    for rows, groups, features in ((16, 1, 16), (1000, 7, 384), (65536 + 15 * 64, 64, 7168),
                                   (96, 3, 200)):
        assert block_scales_floats(rows, groups, features, mode, columnwise) == \
            ext.grouped_block_scales_floats(rows, groups, features, mode, columnwise)


def test_block_ops_pass_opcheck():
    ops = torch.ops.fp8kit
    sizes = torch.tensor([5, 0, 11])
    x = torch.zeros(16 + 15 * 3, 128)
    x[:5] = torch.randn(5, 128)
    x[16:27] = torch.randn(11, 128)
    opcheck(ops.grouped_quantize_block.default,
            (x, sizes, torch.float8_e4m3fn, "block_1x128", True, True))
    d, s, cw, cws = ops.grouped_quantize_block(x, sizes, torch.float8_e4m3fn, "block_1x128",
                                               True, True)
    w_sizes = torch.full((3,), 32)
    wd, ws, wcw, wcws = ops.grouped_quantize_block(torch.randn(96, 128), w_sizes,
                                                   torch.float8_e4m3fn, "block_128x128", True,
                                                   True)
    opcheck(ops.grouped_gemm_block_tokens.default,
            (d, s, wd.view(3, 32, 128), ws, None, None, sizes, torch.float32))
    dy = torch.zeros(x.shape[0], 32)
    dy[:5] = torch.randn(5, 32)
    dy[16:27] = torch.randn(11, 32)
    dy_d, dy_s, _, _ = ops.grouped_quantize_block(dy, sizes, torch.float8_e4m3fn, "block_1x128",
                                                  True, False)
    opcheck(ops.grouped_gemm_block_tokens.default,
            (dy_d, dy_s, None, None, wcw.view(3, 128, 32), wcws, sizes, torch.bfloat16))
    opcheck(ops.grouped_gemm_block_contract.default,
            (cw, cws, cw, cws, sizes, x.shape[0], torch.float32))


def test_check_sizes_op_refuses_counts_that_do_not_sum_to_the_tokens():
    # What the block-scaled path runs on counts on the GPU before it pads
    # them; here on the CPU, where the core's check is the same.
    ops = torch.ops.fp8kit
    sizes = torch.tensor([5, 0, 11])
    opcheck(ops.grouped_check_sizes.default, (sizes, 16))
    assert ops.grouped_check_sizes(sizes, 16).tolist() == [5, 0, 11]
    with pytest.raises(ValueError, match="group_sizes sum to 16 but the input has 17 rows"):
        ops.grouped_check_sizes(sizes, 17)
    with pytest.raises(ValueError, match="group_sizes\\[1\\] is -2"):
        ops.grouped_check_sizes(torch.tensor([5, -2, 13]), 16)


@pytest.mark.gpu
@pytest.mark.parametrize("sizes", [[5, 0, 10], [5, 0, 12], [5, -1, 12]])
def test_counts_on_the_gpu_that_do_not_fit_the_tokens_are_refused(sizes):
    dev = device_of("cuda")
    layer = make(3, 128, 32, device=dev)
    with autocast(recipe=RECIPE), pytest.raises(ValueError, match="group_sizes"):
        layer(torch.randn(16, 128, device=dev), torch.tensor(sizes, device=dev))
    torch.cuda.synchronize()  # and nothing out of range ran on the device


def test_compiles_with_no_graph_break():
    sizes = torch.tensor([5, 0, 27])
    layer = make(3, 128, 32)
    compiled = copy.deepcopy(layer)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    fn = torch.compile(compiled, backend=counter, fullgraph=True)
    x, dy = inputs([5, 0, 27], 128, 32, torch.float32, "cpu")
    want = run(layer, x, dy, sizes)
    xg = x.detach().requires_grad_()
    with autocast(recipe=RECIPE):
        y = fn(xg, sizes)
    y.backward(dy)
    for got, w in zip([y.detach(), xg.grad, compiled.weight.grad], want):
        assert_bits_equal(got, w)
    assert counter.frame_count == 1
