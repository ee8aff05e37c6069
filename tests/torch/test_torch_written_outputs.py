"""Every byte of every fp8kit output is written by fp8kit.

Each case runs twice: plainly, and with torch's
fill_uninitialized_memory, under which every new tensor starts as NaN,
0x7F in FP8 (a NaN too) or the integer maximum. The fill is aten::empty's
own, so it reaches the tensors fp8kit's C++ allocates (at::empty, and the
byte buffers its carved outputs share, filled with 0xFF: NaN in every
float format). Both runs must give the same bytes: an element fp8kit
left unwritten would show the fill in one run and not the other.

compute-sanitizer's initcheck cannot answer this on a GPU for anything
read after a cuBLASLt GEMM: it does not see the GEMM's stores and reports
every element of PyTorch's own matmul output as uninitialised too (seen
in the sanitizer probes of `git log -- docs/results`). These cases cover the
public ops and layers, with sizes off the 16-element FP8 GEMM grid so
that padded paths run."""

import contextlib

import pytest
import torch

import fp8kit.torch as ft
from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling, Format
from torch_reference import DEVICES, device_of

RECIPES = {"current": CurrentScaling(), "delayed": DelayedScaling(amax_history_len=4),
           "delayed_e4m3": DelayedScaling(fp8_format=Format.E4M3, margin=1),
           "block": BlockScaling()}


@contextlib.contextmanager
def filled_allocations():
    """New tensors start filled (torch.use_deterministic_algorithms with
    fill_uninitialized_memory). warn_only: the fill is all this needs, not
    errors from torch's own nondeterministic kernels."""
    was = (torch.are_deterministic_algorithms_enabled(),
           torch.is_deterministic_algorithms_warn_only_enabled(),
           torch.utils.deterministic.fill_uninitialized_memory)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was[0], warn_only=was[1])
        torch.utils.deterministic.fill_uninitialized_memory = was[2]


def _bytes(result) -> list:
    """Every tensor in a nesting of tuples / lists / Float8Tensors, as bytes."""
    if isinstance(result, (tuple, list)):
        return [b for r in result for b in _bytes(r)]
    if result is None:
        return [None]
    if isinstance(result, ft.Float8Tensor):
        return _bytes((result.rowwise_data, result.columnwise_data, result.scale_inv))
    t = result.detach()
    return [(tuple(t.shape), t.dtype, t.contiguous().view(-1).view(torch.uint8).cpu())]


def assert_written(device, case):
    plain = _bytes(case())
    with filled_allocations():
        assert torch.empty(4, device=device).isnan().all(), \
            f"new memory on {device} is not filled: this test would see nothing"
        filled = _bytes(case())
    assert len(plain) == len(filled)
    for i, (p, f) in enumerate(zip(plain, filled)):
        if p is None or f is None:
            assert p is f, f"output {i}: present in one run only"
            continue
        assert p[:2] == f[:2], f"output {i}: {p[:2]} against {f[:2]}"
        differ = (p[2] != f[2]).nonzero().flatten()
        assert differ.numel() == 0, (
            f"output {i} {p[:2]}: {differ.numel()} of {p[2].numel()} bytes differ when new "
            f"memory starts filled, the first at byte {int(differ[0])}: left unwritten (or "
            f"computed by a torch op whose deterministic mode, on for the fill, sums otherwise)")


def test_a_byte_that_differs_between_the_runs_fails():
    runs = iter([torch.zeros(8), torch.zeros(8).index_fill_(0, torch.tensor([5]), 1.0)])
    with pytest.raises(AssertionError, match="2 of 32 bytes differ.*byte 22"):
        assert_written(torch.device("cpu"), lambda: next(runs))


def _x(shape, device, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(24, 40), (3, 5, 48), (1, 16), (0, 32)])
def test_quantizers_and_ops(device, shape):
    dev = device_of(device)

    def case():
        x = _x(shape, dev, scale=3.0)
        delayed = ft.Float8Quantizer(torch.full((1,), 3.0, device=dev), "e4m3", None, True, True)
        current = ft.Float8CurrentScalingQuantizer("e5m2", True, True)
        q = current(x)
        return (delayed(x), q, ft.amax(x), ft.quantize(x, 2.0, "e4m3", True, True),
                ft.quantize_current_scaling(x, "e4m3", True, True),
                ft.dequantize(q.rowwise_data, q.scale_inv, torch.bfloat16),
                ft.columnwise_from_rowwise(q.rowwise_data.reshape(-1, shape[-1])))
    assert_written(dev, case)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("trans_a,trans_b,out_dtype", [(False, True, torch.bfloat16),
                                                       (False, False, torch.float32),
                                                       (True, False, torch.float16)])
def test_gemm(device, trans_a, trans_b, out_dtype):
    dev = device_of(device)
    m, k, n = 24, 48, 40

    def case():
        a = _x((k, m) if trans_a else (m, k), dev, 1)
        b = _x((n, k) if trans_b else (k, n), dev, 2)
        ad, acw, _, asi, _ = ft.quantize_current_scaling(a, "e4m3", True, True)
        bd, bcw, _, bsi, _ = ft.quantize_current_scaling(b, "e4m3", True, True)
        return ft.gemm(ad, asi, acw, bd, bsi, bcw, trans_a, trans_b, out_dtype)
    assert_written(dev, case)


@pytest.mark.parametrize("device", DEVICES)
def test_block_ops(device):
    dev = device_of(device)
    if not ft.supports_block_scaled_fp8_gemm(dev):
        pytest.skip(f"{dev} runs no block-scaled FP8 GEMM")

    def case():
        x, w = _x((24, 256), dev, 3), _x((136, 256), dev, 4)
        xq = ft.quantize_block(x, "e4m3", "block_1x128", True, True)
        wq = ft.quantize_block(w, "e4m3", "block_128x128", True, True)
        y = ft.gemm_block(xq[0], xq[1], xq[2], xq[3], "block_1x128",
                          wq[0], wq[1], wq[2], wq[3], "block_128x128", False, True)
        return xq, wq, y, ft.dequantize_block(xq[0], xq[1], "block_1x128")
    assert_written(dev, case)


def _train(layer, recipe, xs, dev):
    """Two forward/backward steps: outputs, input and parameter gradients."""
    out = []
    for i, x in enumerate(xs):
        layer.zero_grad(set_to_none=True)
        x = x.clone().requires_grad_()
        with ft.autocast(recipe=recipe):
            y = layer(x)
        y.backward(_x(y.shape, dev, 10 + i, 1e-2))
        out += [y, x.grad] + [p.grad for p in layer.parameters()]
    return out


def _layer_case(make, recipe_name, dev, features):
    recipe = RECIPES[recipe_name]
    if isinstance(recipe, BlockScaling) and not ft.supports_block_scaled_fp8_gemm(dev):
        pytest.skip(f"{dev} runs no block-scaled FP8 GEMM")

    def case():
        torch.manual_seed(5)
        layer = make(dev)
        xs = [_x((30, features), dev, 6), _x((2, 9, features), dev, 7, 8.0)]
        return _train(layer, recipe, xs, dev)
    return case


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_linear(device, recipe):
    dev = device_of(device)
    assert_written(dev, _layer_case(lambda d: ft.Linear(128, 144, device=d), recipe, dev, 128))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", ["current", "delayed"])
@pytest.mark.parametrize("norm,activation", [("LayerNorm", "gelu"), ("RMSNorm", "swiglu")])
def test_fused_layers(device, recipe, norm, activation):
    dev = device_of(device)
    assert_written(dev, _layer_case(
        lambda d: ft.LayerNormMLP(128, 144, normalization=norm, activation=activation, device=d),
        recipe, dev, 128))
    assert_written(dev, _layer_case(
        lambda d: ft.LayerNormLinear(128, 144, normalization=norm, device=d), recipe, dev, 128))
