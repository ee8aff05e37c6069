"""fp8kit.torch.GroupedLinear: against fp8kit's own Linear run expert by
expert (bit-identical outputs and gradients; under DelayedScaling over
several steps, the scaling states too), against high precision within
FP8's error, empty and single experts, bad counts, the dispatcher ops
under opcheck, torch.compile with no graph break, and the delayed-scaling
state: inference, state_dict, history length changes."""

import copy

import pytest
import torch
import torch._dynamo.testing
import torch.nn.functional as F

from compile_helpers import fresh_dynamo  # noqa: F401  (autouse fixture)
from fp8kit.recipe import AmaxReduction, BlockScaling, CurrentScaling, DelayedScaling
from fp8kit.torch import GroupedLinear, Linear, autocast
from torch_reference import DEVICES, assert_bits_equal, device_of, opcheck

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
@pytest.mark.parametrize("recipe", [CurrentScaling(), DelayedScaling(amax_history_len=4)],
                         ids=lambda r: type(r).__name__)
def test_under_torch_autocast_a_float32_weight_is_a_master_weight(device, recipe):
    """As fp8kit.torch.Linear: under torch.autocast(bf16) the per-tensor
    recipes cast the float32 weight to FP8 as it is, so each expert still
    computes one Linear's bits; the output has the autocast dtype and the
    weight gradient the weight's."""
    dev = device_of(device)
    sizes = [5, 0, 37, 16]
    layer = make(len(sizes), 32, 48, device=dev)
    x, dy = inputs(sizes, 32, 48, device=dev)
    dy = dy.bfloat16()
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        got = run(layer, x, dy, sizes, recipe)
        want = per_expert_linears(layer, x, dy, sizes, recipe)
    assert got[0].dtype == torch.bfloat16 and got[2].dtype == torch.float32
    for g, w in zip(got[:3], want[:3]):
        assert_bits_equal(g, w)


def test_under_torch_autocast_the_weight_is_cast_from_float32_not_from_bf16():
    """1.0625 + 2**-12 at scale 1 (amax 448) rounds to 1.125 in E4M3, but to
    bf16's 1.0625 first, a tie E4M3 rounds to 1.0: each output of a ones
    input tells one rounding (448 + 255 x 1.125) from two (448 + 255)."""
    k = 256
    layer = make(2, k, 16, bias=False)
    with torch.no_grad():
        layer.weight.fill_(1.0625 + 2.0 ** -12)
        layer.weight[:, :, 0] = 448.0
    with torch.autocast("cpu", dtype=torch.bfloat16), autocast(recipe=RECIPE):
        y = layer(torch.ones(32, k), [16, 16]).float()
    assert torch.allclose(y, torch.full_like(y, 448 + (k - 1) * 1.125), rtol=1e-2), y[0, :4]


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


@pytest.mark.parametrize("recipe", [None, DelayedScaling(), CurrentScaling(), BlockScaling()],
                         ids=["bf16", "delayed", "current", "block"])
@pytest.mark.parametrize("sizes, match", [
    ([3, 4], "sum to 7 but the input has 8 rows"),
    ([5, 5], "sum to 10 but the input has 8 rows"),
    ([-1, 9], "group_sizes\\[0\\] is -1"),
])
def test_counts_that_do_not_fit_the_tokens_are_refused(recipe, sizes, match):
    # The same ValueError under every recipe and outside autocast, before
    # any PyTorch op meets the counts.
    layer = make(2, 16, 16)
    with autocast(enabled=recipe is not None, recipe=recipe), \
            pytest.raises(ValueError, match=match):
        layer(torch.randn(8, 16), sizes)


def test_an_input_of_another_dtype_than_the_weight_is_refused_outside_autocast_too():
    layer = make(2, 16, 16)
    with pytest.raises(RuntimeError, match="input has dtype torch.bfloat16 but weight has dtype "
                                           "torch.float32"):
        layer(torch.randn(8, 16, dtype=torch.bfloat16), [4, 4])


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
    history = torch.rand(3, 5)
    seeded = torch.tensor([[0.0] * 4, [1.0] * 4, [0.0] * 4])
    for record in (False, True):
        opcheck(ops.grouped_quantize_delayed.default,
                (x, sizes, torch.float8_e4m3fn, True, True, history, scale * 2, seeded, 1,
                 "max", record))


@pytest.mark.parametrize("torch_autocast", [False, True], ids=["float32", "bf16-autocast"])
def test_compiles_with_no_graph_break(torch_autocast):
    """Also under torch.autocast, where the float32 weight is a master
    weight and its gradient comes from the GEMM in float32."""
    sizes = torch.tensor([5, 0, 27])
    layer = make(3, 32, 16)
    compiled = copy.deepcopy(layer)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    fn = torch.compile(compiled, backend=counter, fullgraph=True)
    x, dy = inputs([5, 0, 27], 32, 16)
    if torch_autocast:
        dy = dy.bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=torch_autocast):
        want = run(layer, x, dy, sizes)
        got = run_compiled(fn, compiled, x, dy, sizes)
    for g, w in zip(got, want):
        assert_bits_equal(g, w)
    assert counter.frame_count == 1


def run_compiled(fn, module, x, dy, sizes, recipe=RECIPE):
    x = x.detach().requires_grad_()
    module.zero_grad(set_to_none=True)
    with autocast(recipe=recipe):
        y = fn(x, sizes)
    y.backward(dy)
    return y.detach(), x.grad, module.weight.grad, module.bias.grad


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", [CurrentScaling(), DelayedScaling(), BlockScaling(), None],
                         ids=["current", "delayed", "block", "bf16"])
def test_counts_on_the_host_never_wait_for_the_gpu(recipe):
    # Counts given on the host reach the GPU as queued copies: PyTorch's
    # sync debug mode raises on any copy or read that waits for the stream.
    dev = device_of("cuda")
    layer = make(4, 64, 32, dtype=torch.bfloat16, device=dev)
    x, dy = inputs([5, 0, 37, 16], 64, 32, dtype=torch.bfloat16, device=dev)
    sizes = torch.tensor([5, 0, 37, 16])

    def step():
        with autocast(enabled=recipe is not None, recipe=recipe):
            layer(x, sizes).backward(dy)
    step()  # the first call makes the plans, the scaling state and the caches
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")


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


# ------------------------------------------------------ DelayedScaling --

DELAYED = DelayedScaling(amax_history_len=4)
# Token counts per step, each expert without tokens in some step (expert
# 1 in the first, so its output-gradient state starts in a later one).
STEPS = [[5, 0, 37, 16], [9, 12, 0, 20], [0, 30, 3, 11], [16, 16, 16, 16], [7, 1, 0, 2]]


def expert_linears(layer):
    """One fp8kit.torch.Linear per expert, holding its weight and bias."""
    lins = []
    for e in range(layer.num_experts):
        lin = Linear(layer.in_features, layer.out_features, bias=layer.bias is not None,
                     dtype=layer.weight.dtype, device=layer.weight.device)
        with torch.no_grad():
            lin.weight.copy_(layer.weight[e])
            if layer.bias is not None:
                lin.bias.copy_(layer.bias[e])
        lins.append(lin)
    return lins


def run_experts(lins, x, dy, sizes, recipe):
    ys, dxs, dws, dbs = [], [], [], []
    for lin, xe, dye in zip(lins, torch.split(x.detach(), sizes), torch.split(dy, sizes)):
        lin.zero_grad(set_to_none=True)
        xe = xe.clone().requires_grad_()
        with autocast(recipe=recipe):
            ye = lin(xe)
        ye.backward(dye)
        ys.append(ye.detach())
        dxs.append(xe.grad)
        dws.append(lin.weight.grad)
        dbs.append(lin.bias.grad)
    return torch.cat(ys), torch.cat(dxs), torch.stack(dws), torch.stack(dbs)


def step_inputs(step, sizes, layer):
    """Step `step`'s x and dy, their scale changing from step to step."""
    x, dy = inputs(sizes, layer.in_features, layer.out_features, layer.weight.dtype,
                   layer.weight.device, seed=10 + step)
    return (x.detach() * (1 + step % 3)).requires_grad_(), dy / (1 + step)


def grow_weights(*modules):
    """The same change of every weight (the weights' amaxes then move too)."""
    with torch.no_grad():
        for m in modules:
            m.weight.mul_(1.5)


def expect_states_equal(layer, lins, recipe):
    for e, lin in enumerate(lins):
        want = lin.fp8_state_arrays(recipe)["linear"]
        got = {"amax_history": layer.fp8_amax_history[:, e], "scale": layer.fp8_scale[:, e, 0],
               "seeded": layer.fp8_seeded[:, e, 0]}
        for key, t in got.items():
            assert_bits_equal(t.cpu(), torch.from_numpy(want[key]))


def expect_steps_equal(got, want):
    y, dx, dw, db = got
    ry, rdx, rdw, rdb = want
    assert_bits_equal(y, ry)
    assert_bits_equal(dx, rdx)
    assert_bits_equal(dw, rdw)
    torch.testing.assert_close(db.float(), rdb.float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("recipe", [DELAYED, DelayedScaling(amax_history_len=2, margin=1,
                                                            amax_reduction=AmaxReduction.MOST_RECENT)])
def test_delayed_equals_one_linear_per_expert_over_steps(device, dtype, recipe):
    dev = device_of(device)
    layer = make(4, 32, 48, dtype=dtype, device=dev)
    lins = expert_linears(layer)
    for step, sizes in enumerate(STEPS):
        x, dy = step_inputs(step, sizes, layer)
        expect_steps_equal(run(layer, x, dy, sizes, recipe),
                           run_experts(lins, x, dy, sizes, recipe))
        expect_states_equal(layer, lins, recipe)
        grow_weights(layer, *lins)
    assert torch.all(layer.fp8_seeded[..., 0] == 1)


def snapshot(layer):
    return [t.clone() for t in (layer.fp8_amax_history, layer.fp8_scale, layer.fp8_seeded)]


def test_delayed_inference_records_nothing():
    layer = make(3, 32, 16)
    lins = expert_linears(layer)
    sizes = [6, 0, 9]
    x, dy = inputs(sizes, 32, 16)
    with torch.no_grad(), autocast(recipe=DELAYED):
        y = layer(x, sizes)  # fresh: each expert's own amax gives its scales
    fresh = snapshot(layer)
    assert torch.all(fresh[0] == 0) and torch.all(fresh[1] == 1) and torch.all(fresh[2] == 0)
    with torch.no_grad(), autocast(recipe=DELAYED):
        want = torch.cat([lin(xe) for lin, xe in zip(lins, torch.split(x, sizes))])
    assert_bits_equal(y, want)
    run(layer, x, dy, sizes, DELAYED)
    run_experts(lins, x, dy, sizes, DELAYED)
    trained = snapshot(layer)
    x2 = x.detach() * 3
    with torch.no_grad(), autocast(recipe=DELAYED):
        y = layer(x2, sizes)
        want = torch.cat([lin(xe) for lin, xe in zip(lins, torch.split(x2, sizes))])
    assert_bits_equal(y, want)
    with autocast(recipe=DELAYED):  # nothing requires grad: no gradient pass either
        layer.requires_grad_(False)
        layer(x2, sizes)
    for got, before in zip(snapshot(layer), trained):
        assert_bits_equal(got, before)
    expect_states_equal(layer, lins, DELAYED)


def test_delayed_state_dict_round_trip():
    layer = make(4, 32, 48)
    for step, sizes in enumerate(STEPS[:2]):
        run(layer, *step_inputs(step, sizes, layer), sizes, DELAYED)
    saved = copy.deepcopy(layer.state_dict())
    assert saved["fp8_amax_history"].shape == (3, 4, 4)
    loaded = make(4, 32, 48, seed=5)
    loaded.load_state_dict(saved)  # made with the saved shapes
    other = make(4, 32, 48, seed=6)
    run(other, *step_inputs(0, STEPS[0], other), STEPS[0], DelayedScaling(amax_history_len=9))
    other.load_state_dict(saved)  # a state of another length replaced
    for m in (loaded, other):
        for name in ("fp8_amax_history", "fp8_scale", "fp8_seeded"):
            assert_bits_equal(getattr(m, name), getattr(layer, name))
    sizes = STEPS[2]
    x, dy = step_inputs(2, sizes, layer)
    want = run(layer, x, dy, sizes, DELAYED)
    for m in (loaded, other):
        for got, w in zip(run(m, x, dy, sizes, DELAYED), want):
            assert_bits_equal(got, w)
    # A checkpoint without the state (a CurrentScaling layer's) starts it fresh.
    plain = make(4, 32, 48)
    run(plain, *step_inputs(0, STEPS[0], plain), STEPS[0])
    assert "fp8_amax_history" not in plain.state_dict()
    loaded.load_state_dict(plain.state_dict())
    assert loaded.fp8_amax_history is None and "fp8_scale" not in loaded.state_dict()


def test_delayed_history_length_change_starts_fresh():
    layer = make(4, 32, 48)
    fresh = copy.deepcopy(layer)
    for step, sizes in enumerate(STEPS[:2]):
        run(layer, *step_inputs(step, sizes, layer), sizes, DELAYED)
    longer = DelayedScaling(amax_history_len=7)
    x, dy = step_inputs(2, STEPS[2], layer)
    got = run(layer, x, dy, STEPS[2], longer)
    want = run(fresh, x, dy, STEPS[2], longer)
    assert layer.fp8_amax_history.shape == (3, 4, 7)
    for g, w in zip(got, want):
        assert_bits_equal(g, w)
    for name in ("fp8_amax_history", "fp8_scale", "fp8_seeded"):
        assert_bits_equal(getattr(layer, name), getattr(fresh, name))


def test_delayed_compiles_bit_identical_to_eager():
    layer = make(4, 32, 48)
    compiled = copy.deepcopy(layer)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    fn = torch.compile(compiled, backend=counter, fullgraph=True)
    # One token count (a new one would compile again), experts' shares moving.
    for step, sizes in enumerate([[16, 0, 37, 11], [9, 12, 0, 43], [0, 30, 3, 31],
                                  [16, 16, 16, 16]]):
        x, dy = step_inputs(step, sizes, layer)
        sizes = torch.tensor(sizes)
        want = run(layer, x, dy, sizes, DELAYED)
        got = run_compiled(fn, compiled, x, dy, sizes, DELAYED)
        for g, w in zip(got, want):
            assert_bits_equal(g, w)
        for name in ("fp8_amax_history", "fp8_scale", "fp8_seeded"):
            assert_bits_equal(getattr(compiled, name), getattr(layer, name))
        grow_weights(layer, compiled)
    # The state is made while the first call traces, as graph inputs.
    assert counter.frame_count == 1
