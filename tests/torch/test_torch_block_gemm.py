"""fp8kit.torch.gemm_block against a float64 GEMM of the dequantized
operands (block_reference decodes the FP8 bits and scales on its own), for
every layout the training GEMMs use and the mixed-mode ones, bf16 and fp32
outputs, bias and accumulation; the dispatcher ops and their fake kernels
(torch.library.opcheck); the refusals, each naming the fix."""

import numpy as np
import pytest
import torch

import fp8kit.torch as ft
from block_reference import TORCH_FP8_NAME, dequantize_stored
from torch_reference import cuda_or_skip

ROW, BLOCK = "block_1x128", "block_128x128"


def operand(x, mode, rowwise=True, columnwise=False, fmt="e4m3"):
    """{'data', 'sinv', 'cw', 'cw_sinv', 'mode'} of x quantized with `mode`."""
    d, s, cw, cws = ft.quantize_block(x, fmt, mode, rowwise, columnwise)
    return {"data": d, "sinv": s, "cw": cw, "cw_sinv": cws, "mode": mode}


def values(op, columnwise):
    """float64 [rows, cols] of the logical operand as the copy read holds it."""
    q, s = (op["cw"], op["cw_sinv"]) if columnwise else (op["data"], op["sinv"])
    v = dequantize_stored(q.cpu().view(torch.uint8).numpy().reshape(q.shape[0], -1),
                          s.cpu().numpy(), TORCH_FP8_NAME[q.dtype], op["mode"])
    return v.T if columnwise else v


def gemm(a, b, trans_a, trans_b, **kw):
    return ft.gemm_block(a["data"], a["sinv"], a["cw"], a["cw_sinv"], a["mode"], b["data"],
                         b["sinv"], b["cw"], b["cw_sinv"], b["mode"], trans_a, trans_b, **kw)


def data(shape, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    x[..., 3] *= 300  # an outlier column: the blocks keep the rest precise
    return x.to(device)


# (name, A shape, A mode, A's copy, trans_a, B shape, B mode, B's copy, trans_b);
# a copy is "row" or "col" (the K-contiguous one the core reads).
LAYOUTS = [
    ("forward x@w^T", (48, 256), ROW, "row", False, (80, 256), BLOCK, "row", True),
    ("dgrad dy@w", (48, 80), ROW, "row", False, (80, 256), BLOCK, "col", False),
    ("wgrad dy^T@x", (64, 80), ROW, "col", True, (64, 256), ROW, "col", False),
    ("1x128 x 1x128", (48, 384), ROW, "row", False, (200, 384), ROW, "row", True),
    ("128x128 x 1x128", (200, 272), BLOCK, "row", False, (40, 272), ROW, "row", True),
]


def run_layout(layout, device="cpu", out_dtype=torch.float32, bias=False):
    """(fp8kit's result, the float64 product of the dequantized operands,
    the float64 |A| @ |B| that bounds the accumulation's error)."""
    _, a_shape, a_mode, a_copy, ta, b_shape, b_mode, b_copy, tb = layout
    a = operand(data(a_shape, 1, device), a_mode, a_copy == "row", a_copy == "col")
    b = operand(data(b_shape, 2, device), b_mode, b_copy == "row", b_copy == "col")
    va, vb = values(a, a_copy == "col"), values(b, b_copy == "col")
    va, vb = (va.T if ta else va), (vb.T if tb else vb)
    want, magnitude = va @ vb, np.abs(va) @ np.abs(vb)
    kw = {"out_dtype": out_dtype}
    if bias:
        kw["bias"] = torch.linspace(-3, 3, want.shape[1]).to(torch.bfloat16).to(device)
        want = want + kw["bias"].double().cpu().numpy()
    return gemm(a, b, ta, tb, **kw), want, magnitude


def assert_within(got, want, magnitude, out_eps, accumulation):
    """|got - want| <= out_eps |want| + accumulation (|A| @ |B|), elementwise:
    the output's rounding plus the GEMM's summation error."""
    got = got.double().cpu().numpy() if isinstance(got, torch.Tensor) else got
    want = want.double().cpu().numpy() if isinstance(want, torch.Tensor) else want
    err = np.abs(got - want)
    bound = out_eps * np.abs(want) + accumulation * magnitude
    assert np.all(err <= bound), f"error up to {np.max(err / bound):.3g}x the bound"


@pytest.mark.parametrize("layout", LAYOUTS, ids=[lay[0] for lay in LAYOUTS])
def test_every_layout_against_float64(layout):
    got, want, magnitude = run_layout(layout)
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert_within(got, want, magnitude, 2.0 ** -23, 2.0 ** -20)
    got, want, magnitude = run_layout(layout, out_dtype=torch.bfloat16, bias=True)
    assert got.dtype == torch.bfloat16
    assert_within(got, want, magnitude, 2.0 ** -8, 2.0 ** -20)


def test_accumulate_adds_into_out():
    a = operand(data((16, 128), 3), ROW)
    b = operand(data((8, 128), 4), BLOCK)
    out = torch.full((16, 8), 2.5)
    got = gemm(a, b, False, True, out_dtype=torch.float32, accumulate=True, out=out)
    assert got is out
    want = values(a, False) @ values(b, False).T + 2.5
    torch.testing.assert_close(out.double(), torch.from_numpy(want), rtol=1e-6, atol=1e-4)


# opcheck's test_schema detects mutation with torch.allclose, which has no
# FP8 kernel: ops with FP8 inputs run its other checks (their schemas
# declare no mutation).
FP8_INPUT_CHECKS = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def test_dispatcher_ops_and_fake_kernels_agree_with_the_bindings():
    a = operand(data((32, 256), 5), ROW)
    b = operand(data((48, 256), 6), BLOCK)
    args = (a["data"], a["sinv"], None, None, ROW, b["data"], b["sinv"], None, None, BLOCK,
            False, True, torch.bfloat16, None)
    assert torch.equal(torch.ops.fp8kit.gemm_block(*args), gemm(a, b, False, True))
    torch.library.opcheck(torch.ops.fp8kit.gemm_block, args, test_utils=FP8_INPUT_CHECKS)
    x = data((40, 136), 7)
    torch.library.opcheck(torch.ops.fp8kit.quantize_block,
                          (x, torch.float8_e4m3fn, ROW, True, True, 0.0, True))
    d, s, _, _ = ft.quantize_block(x, "e4m3", BLOCK)
    args = (d, s, BLOCK, torch.float32)
    assert torch.equal(torch.ops.fp8kit.dequantize_block(*args), ft.dequantize_block(*args))
    torch.library.opcheck(torch.ops.fp8kit.dequantize_block, args, test_utils=FP8_INPUT_CHECKS)


def test_refusals_name_the_fix():
    x, w = operand(data((16, 128), 8), ROW), operand(data((8, 128), 9), BLOCK, True, True)
    with pytest.raises(ValueError, match="both FP8KIT_SCALING_BLOCK_128X128"):
        gemm(operand(data((16, 128), 8), BLOCK), w, False, True)
    with pytest.raises(TypeError, match="writes torch.bfloat16 or torch.float32"):
        gemm(x, w, False, True, out_dtype=torch.float16)
    with pytest.raises(ValueError, match="a_block_scale_inv has shape"):
        ft.gemm_block(x["data"], w["sinv"], None, None, ROW, w["data"], w["sinv"], None, None,
                      BLOCK, False, True)
    with pytest.raises(ValueError, match="b is given without b_block_scale_inv"):
        ft.gemm_block(x["data"], x["sinv"], None, None, ROW, w["data"], None, None, None, BLOCK,
                      False, True)
    with pytest.raises(ValueError, match="B has no columnwise data"):  # dgrad, w rowwise only
        gemm(operand(data((16, 16), 10), ROW), operand(data((16, 128), 9), BLOCK), False, False)
    with pytest.raises(ValueError, match="inner dimensions must match"):
        gemm(x, w, False, False)
    with pytest.raises(ValueError, match="multiple of 16"):  # K = 120
        gemm(operand(data((16, 120), 11), ROW), operand(data((8, 120), 12), BLOCK), False, True)
    with pytest.raises(ValueError, match="N .* multiple of 8"):
        gemm(x, operand(data((12, 128), 13), BLOCK), False, True)
    with pytest.raises(ValueError, match="M .* multiple of 8"):
        gemm(operand(data((12, 128), 14), ROW), w, False, True)
    with pytest.raises(ValueError, match="bias must be \\[N\\]"):
        gemm(x, w, False, True, bias=torch.zeros(9, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="takes a torch.bfloat16 bias"):
        gemm(x, w, False, True, bias=torch.zeros(8))
    with pytest.raises(ValueError, match="scaling_mode is 'per_tensor'"):
        ft.gemm_block(x["data"], x["sinv"], None, None, "per_tensor", w["data"], w["sinv"],
                      None, None, BLOCK)
    assert ft.supports_block_scaled_fp8_gemm("cpu") is True


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS, ids=[lay[0] for lay in LAYOUTS])
def test_cuda_every_layout_against_float64_and_the_cpu(layout):
    dev = cuda_or_skip()
    if not ft.supports_block_scaled_fp8_gemm(dev):
        with pytest.raises(NotImplementedError, match="Hopper"):
            run_layout(layout, dev)
        return
    # Hopper's FP8 tensor cores keep about 14 bits of a block's running sum
    # before cuBLASLt scales it into float32 (an H200 was off by up to
    # 1.5 * 2^-10 of sum |a b|): a 128-deep block may be off by
    # 128 * 2^-14 = 2^-7 of its sum |a b| (the CPU's float32 sum, 2^-20).
    acc = 2.0 ** -7
    got, want, magnitude = run_layout(layout, dev)
    assert_within(got, want, magnitude, 2.0 ** -23, acc)
    cpu, _, _ = run_layout(layout)
    assert_within(got, cpu, magnitude, 2.0 ** -23, acc + 2.0 ** -20)
    got, want, magnitude = run_layout(layout, dev, torch.bfloat16, bias=True)
    assert_within(got, want, magnitude, 2.0 ** -8, acc)
