"""fp8kit.torch quantize / dequantize / current scaling / delayed scaling
against ml_dtypes and float32 NumPy, bit for bit; CUDA against CPU on a GPU.

The reference is ml_dtypes' conversion of clip(x * scale, -max, max) with
x * scale a float32 multiply. NaN inputs become the canonical 0x7F (the
core's documented policy), so NaN lanes are checked for 0x7F and the other
lanes bitwise.
"""

import math

import numpy as np
import pytest
import torch

import fp8_reference as ref
import fp8kit.torch as ft
from torch_reference import (CANONICAL_NAN, FP8_MAX, TORCH_FP8, all_bf16,
                             assert_fp8_equal_reference, cuda_or_skip, current_scale, decode,
                             fp8_bits, random_f32, to_numpy_f32)

FORMATS = ["e4m3", "e5m2"]
# Powers of two, values that make x * scale round, tiny and huge scales.
SCALES = [1.0, 0.125, 37.5, 1.0 / 3.0, 3.0e-3, 1.0e4, 2.0 ** -20, 2.0 ** 40]


def assert_same_values(a: torch.Tensor, b: torch.Tensor):
    """Equal values (NaN where the other is NaN), signed zeros included."""
    assert a.dtype == b.dtype and a.shape == b.shape
    nan = torch.isnan(a)
    assert torch.equal(nan, torch.isnan(b))
    assert torch.equal(torch.where(nan, 0, a), torch.where(nan, 0, b))
    assert torch.equal(torch.signbit(a) | nan, torch.signbit(b) | nan)


def scale_t(s, device="cpu"):
    return torch.tensor([s], dtype=torch.float32, device=device)


# ------------------------------------------------------- exhaustive / random
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scale", SCALES)
def test_all_bf16_patterns_bit_exact(fmt, scale):
    x = all_bf16().reshape(256, 256)
    data, columnwise, sinv = ft.quantize(x, scale_t(scale), fmt, rowwise=True, columnwise=True)
    assert data.dtype == TORCH_FP8[fmt] and data.shape == x.shape
    assert_fp8_equal_reference(data, x, scale, fmt)
    assert torch.equal(columnwise.view(torch.uint8), data.view(torch.uint8).t())
    assert sinv.item() == np.float32(1.0) / np.float32(scale)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scale", [1.0, 37.5, 2.0 ** -9])
def test_all_fp16_patterns_bit_exact(fmt, scale):
    x = torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16).view(torch.float16)
    data, _, _ = ft.quantize(x, scale_t(scale), fmt)
    assert_fp8_equal_reference(data, x, scale, fmt)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scale", SCALES)
def test_random_fp32_bit_exact(fmt, scale):
    x = random_f32(200_003, seed=int(scale * 1000) % 997)
    data, _, _ = ft.quantize(x, scale_t(scale), fmt)
    assert_fp8_equal_reference(data, x, scale, fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_nan_inf_zero_denormal_saturation(fmt):
    m = FP8_MAX[fmt]
    vals = [float("nan"), -float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-45, -1e-45,
            1e-40, m, -m, m * 1.01, -m * 1.01, 3.0e38, 2.0 ** -9, 2.0 ** -17, 2.0 ** -16,
            1.5 * 2.0 ** -17]
    x = torch.tensor(vals, dtype=torch.float32)
    data, columnwise, _ = ft.quantize(x, scale_t(1.0), fmt, True, True)
    bits = fp8_bits(data)
    assert bits[0] == CANONICAL_NAN and bits[1] == CANONICAL_NAN
    maxbits = 0x7E if fmt == "e4m3" else 0x7B
    assert list(bits[2:4]) == ([0x7F, 0x7F] if fmt == "e4m3" else [0x7C, 0xFC])  # inf: NaN/inf
    assert bits[4] == 0x00 and bits[5] == 0x80              # signed zeros
    assert bits[6] == 0x00 and bits[7] == 0x80              # tiny rounds to signed zero
    assert bits[11] == maxbits and bits[12] == 0x80 | maxbits and bits[13] == maxbits
    assert_fp8_equal_reference(data, x, 1.0, fmt)
    assert np.array_equal(fp8_bits(columnwise).reshape(-1), bits)


# ------------------------------------------------------------ layouts, amax
@pytest.mark.parametrize("shape", [(), (1,), (5,), (3, 7), (2, 3, 17), (4, 1, 5, 9), (0, 3),
                                   (3, 0), (2, 0, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_shapes_columnwise_is_transpose_and_amax(shape, dtype):
    g = torch.Generator().manual_seed(sum(shape) + 3)
    x = (torch.randn(shape, generator=g) * 10).to(dtype)
    amax = torch.full((1,), -1.0)
    data, columnwise, sinv = ft.quantize(x, scale_t(8.0), "e4m3", True, True, amax_out=amax)
    assert data.shape == x.shape
    lead = math.prod(shape[:-1]) if shape else 1
    last = shape[-1] if shape else 1
    assert columnwise.shape == (last, lead)
    assert torch.equal(columnwise.view(torch.uint8),
                       data.view(torch.uint8).reshape(lead, last).t())
    assert_fp8_equal_reference(data, x, 8.0, "e4m3")
    want = float(np.max(np.abs(to_numpy_f32(x)))) if x.numel() else 0.0
    assert amax.item() == want


def test_rowwise_only_and_columnwise_only():
    x = torch.randn(6, 10)
    d, dt, _ = ft.quantize(x, scale_t(2.0), "e5m2", rowwise=True, columnwise=False)
    assert d is not None and dt is None
    d2, dt2, _ = ft.quantize(x, scale_t(2.0), "e5m2", rowwise=False, columnwise=True)
    assert d2 is None and torch.equal(dt2.view(torch.uint8), d.view(torch.uint8).t())


def test_non_contiguous_input_and_python_scale():
    x = torch.randn(40, 24).t()[:, ::2]
    d, _, sinv = ft.quantize(x, 4.0, "e4m3")
    assert_fp8_equal_reference(d, x.contiguous(), 4.0, "e4m3")
    assert sinv.item() == 0.25


# --------------------------------------------------------------- dequantize
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dequantize_is_q_times_scale_inv(fmt, out_dtype):
    x = all_bf16().reshape(64, 1024)
    data, columnwise, sinv = ft.quantize(x, scale_t(37.5), fmt, True, True)
    want = (decode(data).astype(np.float32) * np.float32(sinv.item()))  # float32 multiply
    want = torch.from_numpy(want).to(out_dtype)
    got = ft.dequantize(data, sinv, out_dtype)
    assert got.dtype == out_dtype and got.shape == x.shape
    assert_same_values(got, want)
    got_t = ft.dequantize(columnwise, sinv, out_dtype, from_columnwise=True, shape=x.shape)
    assert_same_values(got_t, want)


def test_dequantize_columnwise_rank3_and_default_shape():
    x = torch.randn(2, 3, 16)
    data, columnwise, sinv = ft.quantize(x, scale_t(16.0), "e4m3", True, True)
    a = ft.dequantize(data, sinv, torch.float32)
    b = ft.dequantize(columnwise, sinv, torch.float32, from_columnwise=True, shape=(2, 3, 16))
    assert torch.equal(a, b)
    c = ft.dequantize(columnwise, sinv, torch.float32, from_columnwise=True)
    assert c.shape == (6, 16) and torch.equal(c, a.reshape(6, 16))
    assert (a - x).abs().max().item() <= 0.0625 * x.abs().max().item()


# ---------------------------------------------------------- current scaling
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mag", [1e-3, 1.0, 300.0, 1e6])
def test_current_scaling_rule(fmt, mag):
    g = torch.Generator().manual_seed(int(mag) + 11)
    x = (torch.randn(37, 53, generator=g) * mag).to(torch.bfloat16)
    data, columnwise, scale, sinv, amax = ft.quantize_current_scaling(x, fmt, True, True)
    a = float(np.max(np.abs(to_numpy_f32(x))))
    assert amax.item() == a
    s = current_scale(a, fmt)
    assert scale.item() == s
    assert sinv.item() == np.float32(1.0) / s
    assert_fp8_equal_reference(data, x, float(s), fmt)
    assert torch.equal(columnwise.view(torch.uint8), data.view(torch.uint8).t())
    # The largest |x| lands on (or, after rounding, next to) the format's max.
    assert ft.dequantize(data, sinv, torch.float32).abs().max().item() == pytest.approx(a, rel=0.07)


@pytest.mark.parametrize("fmt", FORMATS)
def test_current_scaling_epsilon_and_power_of_two(fmt):
    x = torch.tensor([[1e-6, -3e-7], [2e-6, 0.0]])
    _, _, scale, sinv, amax = ft.quantize_current_scaling(x, fmt, amax_epsilon=1e-3)
    assert scale.item() == current_scale(amax.item(), fmt, epsilon=1e-3)
    y = torch.randn(8, 16) * 3.7
    _, _, scale, sinv, amax = ft.quantize_current_scaling(y, fmt, power_2_scale=True)
    s = scale.item()
    assert s == current_scale(amax.item(), fmt, pow2=True)
    assert math.frexp(s)[0] == 0.5  # a power of two
    assert sinv.item() * s == 1.0   # so scale_inv is exact


@pytest.mark.parametrize("special", [0.0, float("nan"), float("inf")])
def test_current_scaling_degenerate_amax_gives_scale_one(special):
    x = torch.zeros(4, 4)
    x[1, 2] = special
    data, _, scale, sinv, amax = ft.quantize_current_scaling(x, "e4m3")
    assert scale.item() == 1.0 and sinv.item() == 1.0
    assert_fp8_equal_reference(data, x, 1.0, "e4m3")


def test_current_scaling_empty_and_rank0():
    d, dt, scale, sinv, amax = ft.quantize_current_scaling(torch.zeros(0, 5), "e4m3", True, True)
    assert d.shape == (0, 5) and dt.shape == (5, 0) and scale.item() == 1.0
    d, dt, scale, sinv, amax = ft.quantize_current_scaling(torch.tensor(3.0), "e5m2", True, True)
    assert d.shape == () and dt.shape == (1, 1) and amax.item() == 3.0
    assert_fp8_equal_reference(d, torch.tensor(3.0), float(scale.item()), "e5m2")


# ---------------------------------------------------------- delayed scaling
@pytest.mark.parametrize("reduction", ["max", "most_recent"])
@pytest.mark.parametrize("margin", [0, 2])
def test_delayed_scaling_update_rule(reduction, margin):
    length = 5
    amax_values = [3.0, 0.0, float("nan"), 1e-30, float("inf"), 1000.0, 0.25]
    fmts = ["e4m3", "e5m2", "e4m3", "e5m2", "e4m3", "e5m2", "e4m3"]
    n = len(amax_values)
    g = torch.Generator().manual_seed(3)
    hist = [torch.rand(length, generator=g) * 10 for _ in range(n)]
    amaxes = [torch.tensor([a]) for a in amax_values]
    scales = [torch.tensor([0.5 + i]) for i in range(n)]
    sinvs = [torch.zeros(1) for _ in range(n)]
    want = ref.delayed_update(torch.stack(hist).numpy(), amax_values,
                              [s.item() for s in scales], fmts, margin, reduction)
    for step in range(3):  # several steps: the history keeps rolling
        ft.delayed_scaling_update(hist, amaxes, scales, sinvs, fmts, margin, reduction)
        want_h, want_s, want_si = want
        for i in range(n):
            assert np.array_equal(hist[i].numpy(), want_h[i], equal_nan=True), (step, i)
            assert scales[i].item() == want_s[i] and sinvs[i].item() == want_si[i], (step, i)
        want = ref.delayed_update(want_h, amax_values, want_s, fmts, margin, reduction)


def test_delayed_scaling_then_quantize_uses_new_scale():
    x = torch.randn(32, 32) * 5
    hist, scale, sinv = torch.zeros(4), torch.ones(1), torch.ones(1)
    amax = torch.zeros(1)
    d, _, _ = ft.quantize(x, scale, "e4m3", amax_out=amax)  # step 0: scale 1, records amax
    ft.delayed_scaling_update([hist], [amax], [scale], [sinv], ["e4m3"], 0, "max")
    assert scale.item() == np.float32(FP8_MAX["e4m3"]) / np.float32(x.abs().max().item())
    d, _, s_inv = ft.quantize(x, scale, "e4m3")
    assert_fp8_equal_reference(d, x, scale.item(), "e4m3")
    assert s_inv.item() == sinv.item()


# ------------------------------------------------------------------- errors
def test_errors_name_the_argument_and_the_fix():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="fp8_dtype is 'e3m4'; use 'e4m3'"):
        ft.quantize(x, 1.0, "e3m4")
    with pytest.raises(ValueError, match="rowwise and columnwise are both False"):
        ft.quantize(x, 1.0, "e4m3", rowwise=False, columnwise=False)
    with pytest.raises(TypeError, match="scale has dtype torch.float64"):
        ft.quantize(x, torch.ones(1, dtype=torch.float64), "e4m3")
    with pytest.raises(ValueError, match=r"scale has shape \[2\]"):
        ft.quantize(x, torch.ones(2), "e4m3")
    with pytest.raises(ValueError, match=r"amax_out has shape \[3\]"):
        ft.quantize(x, 1.0, "e4m3", amax_out=torch.zeros(3))
    with pytest.raises(TypeError, match="x has dtype torch.int32"):
        ft.quantize(torch.ones(3, dtype=torch.int32), 1.0, "e4m3")
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        ft.quantize([1.0], 1.0, "e4m3")
    with pytest.raises(ValueError, match="amax_epsilon is -1"):
        ft.quantize_current_scaling(x, "e4m3", amax_epsilon=-1.0)
    d, dt, sinv = ft.quantize(x, 1.0, "e4m3", True, True)
    with pytest.raises(TypeError, match="data has dtype torch.float32"):
        ft.dequantize(x, sinv)
    with pytest.raises(TypeError, match="out_dtype is torch.float64"):
        ft.dequantize(d, sinv, torch.float64)
    with pytest.raises(ValueError, match=r"shape \[4, 4\] has columnwise layout"):
        ft.dequantize(dt, sinv, torch.float32, from_columnwise=True, shape=(4, 4))
    with pytest.raises(ValueError, match="same length"):
        ft.delayed_scaling_update([torch.zeros(3)], [], [], [], [])
    with pytest.raises(ValueError, match="amax_reduction is 'mean'"):
        ft.delayed_scaling_update([torch.zeros(3)], [torch.zeros(1)], [torch.ones(1)],
                                  [torch.ones(1)], ["e4m3"], 0, "mean")
    with pytest.raises(TypeError, match=r"amax_histories\[0\] has dtype torch.float64"):
        ft.delayed_scaling_update([torch.zeros(3, dtype=torch.float64)], [torch.zeros(1)],
                                  [torch.ones(1)], [torch.ones(1)], ["e4m3"])
    with pytest.raises(ValueError, match=r"fp8_dtypes\[0\] is 'fp8'"):
        ft.delayed_scaling_update([torch.zeros(3)], [torch.zeros(1)], [torch.ones(1)],
                                  [torch.ones(1)], ["fp8"])
    with pytest.raises(ValueError, match="9 dimensions; fp8kit supports up to 8"):
        ft.quantize(torch.zeros([1] * 9), 1.0, "e4m3")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scale", [0.0, -0.0, -2.0, math.inf, -math.inf, math.nan])
def test_a_scale_not_finite_and_positive_gives_nan(fmt, scale):
    # fp8kit's policy for a given scale (common/include/fp8kit/quantize.h):
    # every output element and scale_inv NaN, never a plausible result.
    x = torch.randn(4, 16)
    data, cw, sinv = ft.quantize(x, scale, fmt, rowwise=True, columnwise=True)
    for t in (data, cw):
        assert t.float().isnan().all(), t
    assert sinv.isnan().all()
    f8 = ft.Float8Quantizer(torch.tensor([scale]), fmt)(x)
    assert f8.dequantize().isnan().all() and f8._scale_inv.isnan().all()


# ------------------------------------------------------------------- CUDA ----
def _cuda_vs_cpu(x, fmt, scale):
    dev = cuda_or_skip()
    amax_c, amax_g = torch.zeros(1), torch.zeros(1, device=dev)
    c = ft.quantize(x, scale_t(scale), fmt, True, True, amax_out=amax_c)
    g = ft.quantize(x.to(dev), scale_t(scale, dev), fmt, True, True, amax_out=amax_g)
    assert g[0].device == dev and g[1].device == dev and g[2].device == dev
    assert torch.equal(g[0].cpu().view(torch.uint8), c[0].view(torch.uint8))
    assert torch.equal(g[1].cpu().view(torch.uint8), c[1].view(torch.uint8))
    assert g[2].item() == c[2].item()
    assert torch.equal(amax_g.cpu(), amax_c, ) or (amax_g.isnan().all() and amax_c.isnan().all())


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scale", SCALES)
def test_cuda_all_bf16_patterns_match_cpu(fmt, scale):
    _cuda_vs_cpu(all_bf16().reshape(256, 256), fmt, scale)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scale", SCALES)
def test_cuda_random_fp32_matches_cpu(fmt, scale):
    _cuda_vs_cpu(random_f32(1 << 20, seed=5).reshape(1024, 1024), fmt, scale)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 5), (2, 3, 17), (129, 65), (1000, 1000),
                                   (3, 4097, 33), (8193, 7), (0, 9), (1, 1 << 20)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_odd_shapes_match_cpu(shape, dtype):
    g = torch.Generator().manual_seed(sum(shape))
    _cuda_vs_cpu((torch.randn(shape, generator=g) * 100).to(dtype), "e4m3", 1.75)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("pow2", [False, True])
def test_cuda_current_scaling_and_dequantize_match_cpu(fmt, pow2):
    dev = cuda_or_skip()
    for x in (all_bf16().reshape(256, 256), random_f32(300_001, 9), torch.zeros(5, 3),
              torch.randn(3, 4097, 17).to(torch.float16) * 1e-3):
        c = ft.quantize_current_scaling(x, fmt, True, True, 1e-12, pow2)
        g = ft.quantize_current_scaling(x.to(dev), fmt, True, True, 1e-12, pow2)
        for a, b in zip(c[:2], g[:2]):
            assert torch.equal(b.cpu().view(torch.uint8), a.view(torch.uint8))
        for a, b in zip(c[2:], g[2:]):
            assert a.item() == b.item() or (math.isnan(a.item()) and math.isnan(b.item()))
        for out_dtype in (torch.float32, torch.bfloat16, torch.float16):
            dc = ft.dequantize(c[0], c[3], out_dtype)
            dg = ft.dequantize(g[0], g[3], out_dtype)
            assert_same_values(dg.cpu(), dc)
            dgt = ft.dequantize(g[1], g[3], out_dtype, True, list(x.shape))
            assert_same_values(dgt.cpu(), dc)


@pytest.mark.gpu
def test_cuda_delayed_scaling_update_matches_cpu():
    dev = cuda_or_skip()
    n, length = 130, 7  # more than one launch's worth of tensors
    g = torch.Generator().manual_seed(1)
    hist = [torch.rand(length, generator=g) * 10 for _ in range(n)]
    amax = [torch.tensor([v]) for v in (torch.rand(n, generator=g) * 100).tolist()]
    amax[3] = torch.tensor([float("nan")])
    amax[4] = torch.tensor([0.0])
    scale = [torch.rand(1, generator=g) + 0.5 for _ in range(n)]
    sinv = [torch.zeros(1) for _ in range(n)]
    fmts = ["e4m3" if i % 3 else "e5m2" for i in range(n)]
    gpu = [[t.to(dev) for t in lst] for lst in (hist, amax, scale, sinv)]
    ft.delayed_scaling_update(hist, amax, scale, sinv, fmts, 1, "max")
    ft.delayed_scaling_update(*gpu, fmts, 1, "max")
    for lc, lg in zip((hist, amax, scale, sinv), gpu):
        for a, b in zip(lc, lg):
            assert torch.equal(a.nan_to_num(-1.0), b.cpu().nan_to_num(-1.0))


@pytest.mark.gpu
def test_cuda_device_mismatch_is_a_clear_error():
    dev = cuda_or_skip()
    with pytest.raises(ValueError, match="scale is on cpu but x is on cuda"):
        ft.quantize(torch.randn(4, device=dev), torch.ones(1), "e4m3")


def test_extension_exports_the_core_constants():
    # Python repeats none of these: they come from the core through the
    # extension module.
    from fp8kit.torch._ext import ext
    assert ext.FP8_MAX == FP8_MAX  # ml_dtypes' finfo max of each format
    assert ext.GEMM_DIM_MULTIPLE == 16
    assert ext.AMAX_REDUCTION_CODES == {"max": 0, "most_recent": 1}
    assert set(ext.AMAX_REDUCTION_CODES) == {r.value for r in ft.AmaxReduction}


@pytest.mark.parametrize("shape, want", [((), (1, 1)), ((7,), (7, 1)), ((3, 5), (5, 3)),
                                         ((2, 3, 16), (16, 6)), ((0, 4), (4, 0))])
def test_columnwise_shape_is_last_by_product_of_leading(shape, want):
    from fp8kit.torch._ext import ext
    assert ext.columnwise_shape(shape) == want
    if len(shape) >= 1:
        _, columnwise, _ = ft.quantize(torch.zeros(shape), 1.0, "e4m3", True, True)
        assert tuple(columnwise.shape) == want
