"""The fused-op bindings (ext.norm_forward/backward,
ext.activation_forward/backward) against a NumPy reimplementation of the
documented float32 order (fused_reference.py): FP8 bytes, statistics,
gradients and column sums bit for bit; the delayed-scaling slot they
update; clear errors for bad arguments; CUDA against CPU (the norms bit
for bit, the activations within fp8kit/activation.h's bound)."""

import numpy as np
import pytest
import torch

import fused_reference as R
from torch_reference import (column_sums_f32, cuda_or_skip, fp8_bits,
                             ref_quantize_bits, to_numpy_f32)
from fp8kit.recipe import CurrentScaling, DelayedScaling
from fp8kit.torch._ext import ext

RECIPES = {"delayed": DelayedScaling(amax_history_len=4), "current": CurrentScaling()}
DTYPES = (torch.float32, torch.bfloat16)


def rounded(v: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """float32 values rounded to `dtype` (RNE), back in float32."""
    return to_numpy_f32(torch.from_numpy(np.ascontiguousarray(v)).to(dtype))


def check_cast(data, columnwise, scale_inv, values: np.ndarray, fmt: str):
    """The FP8 copies are quantize(values * scale) with the scale a fresh
    slot or current scaling takes from values' own amax (margin 0, no
    epsilon): bit for bit, both layouts."""
    amax = np.max(np.abs(values)) if values.size else 0.0
    scale = R.seed_scale(amax, fmt) if amax > 0 else np.float32(1)
    want = ref_quantize_bits(torch.from_numpy(values), scale, fmt)
    if data is not None:
        np.testing.assert_array_equal(fp8_bits(data), want)
    if columnwise is not None:
        np.testing.assert_array_equal(fp8_bits(columnwise), want.T)
    assert scale_inv.item() == np.float32(1) / scale
    return amax, scale


def values(rows, cols, dtype, seed, spread=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, cols, generator=g) * spread + 0.1 * seed).to(dtype)


@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("rows", [0, 7, 37])
def test_norm_forward_bits(normalization, dtype, recipe, rows):
    hidden = 320  # 40 chunks of 8: lanes 0..7 add two chunks
    ln = normalization == "LayerNorm"
    x = values(rows, hidden, dtype, 1, spread=3.0)
    gamma = (1 + 0.5 * values(1, hidden, dtype, 2)[0]).to(dtype)
    beta = values(1, hidden, dtype, 3)[0] if ln else None
    st = ext.LinearState(RECIPES[recipe], "cpu")
    data, cw, sinv, mean, rsigma, y = ext.norm_forward(
        x, gamma, beta, normalization, 1e-5, st, 0, True, True, True, True)
    y32, mean_r, rsigma_r = R.norm_forward(to_numpy_f32(x), to_numpy_f32(gamma),
                                           to_numpy_f32(beta) if ln else None, ln, 1e-5)
    np.testing.assert_array_equal(to_numpy_f32(rsigma), rsigma_r)
    if ln:
        np.testing.assert_array_equal(to_numpy_f32(mean), mean_r)
    else:
        assert mean is None
    np.testing.assert_array_equal(to_numpy_f32(y), rounded(y32, dtype))
    amax, scale = check_cast(data, cw, sinv, y32, "e4m3")
    if recipe == "delayed":  # recorded: the slot's history and next scale
        assert st.seeded == [True, False, False]
        assert st.amax_history[0, 0].item() == np.float32(amax)
        if amax > 0:
            assert st.scale[0].item() == scale


@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("rows", [1, 45, 1100])  # 1100: three groups of tiles, the last cut
def test_norm_backward_bits(normalization, rows):
    hidden = 64
    ln = normalization == "LayerNorm"
    x = values(rows, hidden, torch.float32, 4, spread=2.0)
    gamma = 1 + 0.3 * values(1, hidden, torch.float32, 5)[0]
    beta = values(1, hidden, torch.float32, 6)[0] if ln else None
    dy = values(rows, hidden, torch.float32, 7)
    st = ext.LinearState(CurrentScaling(), "cpu")
    _, _, _, mean, rsigma, _ = ext.norm_forward(x, gamma, beta, normalization, 1e-5, st, 0,
                                                False)
    dx, dgamma, dbeta = ext.norm_backward(dy, x, mean, rsigma, gamma, normalization, 1e-5)
    dx_r, dg_r, db_r = R.norm_backward(dy.numpy(), x.numpy(), mean.numpy() if ln else None,
                                       rsigma.numpy(), gamma.numpy(), ln)
    np.testing.assert_array_equal(dx.numpy(), dx_r)
    np.testing.assert_array_equal(dgamma.numpy(), dg_r)
    if ln:
        np.testing.assert_array_equal(dbeta.numpy(), db_r)
    else:
        assert dbeta is None


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("rows", [0, 9, 40])
def test_activation_bits(activation, dtype, recipe, rows):
    f = 48
    width = 2 * f if activation == "swiglu" else f
    h = values(rows, width, dtype, 8, spread=2.5)
    st = ext.LinearState(RECIPES[recipe], "cpu")
    data, cw, sinv, a = ext.activation_forward(h, activation, st, 0, True, True, True, True)
    a32 = R.activation_forward(to_numpy_f32(h), activation)
    np.testing.assert_array_equal(to_numpy_f32(a), rounded(a32, dtype))
    check_cast(data, cw, sinv, a32, "e4m3")

    d_a = values(rows, f, dtype, 9)
    sums = rows > 1
    data, cw, sinv, db, dh = ext.activation_backward(
        d_a, h, activation, st, 2, True, True, True, dtype if sums else None, True)
    dh32 = R.activation_backward(to_numpy_f32(d_a), to_numpy_f32(h), activation)
    np.testing.assert_array_equal(to_numpy_f32(dh), rounded(dh32, dtype))
    check_cast(data, cw, sinv, dh32, "e5m2")  # the hybrid format's gradient
    if sums:
        np.testing.assert_array_equal(to_numpy_f32(db), rounded(column_sums_f32(dh32), dtype))


def test_delayed_slot_casts_with_its_scale_after_seeding():
    """Step 2 casts with the scale step 1 recorded, not its own amax; a
    pass without record leaves the slot as it is."""
    st = ext.LinearState(DelayedScaling(amax_history_len=2, margin=1), "cpu")
    gamma = torch.ones(32)
    x1, x2 = values(5, 32, torch.float32, 10), values(5, 32, torch.float32, 11, spread=4)
    ext.norm_forward(x1, gamma, None, "RMSNorm", 0.0, st, 0, True)
    y1, _, _ = R.norm_forward(x1.numpy(), gamma.numpy(), None, False, 0.0)
    amax1 = np.max(np.abs(y1))
    scale1 = R.seed_scale(amax1, "e4m3", margin=1)
    assert st.scale[0].item() == scale1 and st.seeded[0]
    data, _, sinv, _, _, _ = ext.norm_forward(x2, gamma, None, "RMSNorm", 0.0, st, 0, False)
    y2, _, _ = R.norm_forward(x2.numpy(), gamma.numpy(), None, False, 0.0)
    np.testing.assert_array_equal(fp8_bits(data), ref_quantize_bits(torch.from_numpy(y2),
                                                                    scale1, "e4m3"))
    assert sinv.item() == np.float32(1) / scale1
    assert st.scale[0].item() == scale1 and st.amax_history[0, 0].item() == amax1


def _bad(fn, match, error=ValueError):
    with pytest.raises(error, match=match):
        fn()


def test_bad_arguments_raise_clear_errors():
    st = ext.LinearState(DelayedScaling(), "cpu")
    x, g, b = torch.randn(4, 32), torch.ones(32), torch.zeros(32)
    nf = ext.norm_forward
    _bad(lambda: nf(x.double(), g, b, "LayerNorm", 1e-5, st, 0, True), "x has dtype torch.float64",
         TypeError)
    _bad(lambda: nf(x, g.half(), b, "LayerNorm", 1e-5, st, 0, True), "gamma has dtype", TypeError)
    _bad(lambda: nf(x, torch.ones(16), b, "LayerNorm", 1e-5, st, 0, True), r"gamma .* \[32\]")
    _bad(lambda: nf(x, g, None, "LayerNorm", 1e-5, st, 0, True), "beta is None")
    _bad(lambda: nf(x, g, b, "RMSNorm", 1e-5, st, 0, True), "pass beta=None")
    _bad(lambda: nf(x, g, b, "BatchNorm", 1e-5, st, 0, True), "'LayerNorm' or 'RMSNorm'")
    _bad(lambda: nf(x, g, b, "LayerNorm", -1.0, st, 0, True), "epsilon")
    _bad(lambda: nf(x, g, b, "LayerNorm", 1e-5, st, 3, True), "slot")
    _bad(lambda: nf(x, g, b, "LayerNorm", 1e-5, "state", 0, True), "LinearState", TypeError)
    _bad(lambda: nf(torch.randn(4, 24), torch.ones(24), torch.zeros(24), "LayerNorm", 1e-5, st,
                    0, True), "multiple of 16")
    _bad(lambda: nf(x, g, b, "LayerNorm", 1e-5, st, 0, True, False, False), "at least one")
    offset = torch.randn(4 * 32 + 1)[1:].view(4, 32)  # 4 bytes past an aligned start
    _bad(lambda: nf(offset, g, b, "LayerNorm", 1e-5, st, 0, True), "16-byte aligned")
    _bad(lambda: nf(x.to("meta"), g, b, "LayerNorm", 1e-5, st, 0, True), "x", (ValueError,
                                                                             TypeError))
    _, _, _, mean, rsigma, _ = nf(x, g, b, "LayerNorm", 1e-5, st, 0, True)
    nb = ext.norm_backward
    _bad(lambda: nb(x.bfloat16(), x, mean, rsigma, g, "LayerNorm", 1e-5), "dy has dtype",
         TypeError)
    _bad(lambda: nb(x, x, None, rsigma, g, "LayerNorm", 1e-5), "mean is None")
    _bad(lambda: nb(x, x, mean, rsigma[:2], g, "LayerNorm", 1e-5), "rsigma has shape")
    _bad(lambda: nb(x, x, mean.double(), rsigma, g, "LayerNorm", 1e-5), "float32", TypeError)
    af, ab = ext.activation_forward, ext.activation_backward
    h = torch.randn(4, 64)
    _bad(lambda: af(h, "relu", st, 0, True), "'gelu' or 'swiglu'")
    _bad(lambda: af(torch.randn(4, 48), "swiglu", st, 0, True), "SwiGLU's h")
    _bad(lambda: af(h.double(), "gelu", st, 0, True), "h has dtype", TypeError)
    _bad(lambda: ab(torch.randn(4, 64), h, "swiglu", st, 2), r"d_a has shape .* \[4, 32\]")
    _bad(lambda: ab(torch.randn(1, 32), h[:1], "swiglu", st, 2, True, True, True,
                    torch.float32), "column sums")
    _bad(lambda: ab(torch.randn(4, 32), h, "swiglu", st, 2, True, True, True, torch.int32),
         "sums_dtype", TypeError)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("rows", [0, 33, 1000])
def test_cuda_matches_cpu(recipe, rows):
    dev = cuda_or_skip()
    for normalization in ("LayerNorm", "RMSNorm"):
        ln = normalization == "LayerNorm"
        x = values(rows, 256, torch.bfloat16, 12, spread=3.0)
        g = values(1, 256, torch.bfloat16, 13)[0]
        b = values(1, 256, torch.bfloat16, 14)[0] if ln else None
        dy = values(rows, 256, torch.bfloat16, 15)
        outs = []
        for d in ("cpu", dev):
            st = ext.LinearState(RECIPES[recipe], d)
            mv = lambda t: None if t is None else t.to(d)  # noqa: E731
            f = ext.norm_forward(mv(x), mv(g), mv(b), normalization, 1e-5, st, 0, True, True,
                                 True, True)
            bw = ext.norm_backward(mv(dy), mv(x), f[3], f[4], mv(g), normalization, 1e-5)
            outs.append([t for t in (*f, *bw, st.scale, st.amax_history) if t is not None])
        for c, gpu in zip(*outs):
            assert torch.equal(c.view(torch.uint8) if c.element_size() == 1 else c,
                               (gpu.view(torch.uint8) if gpu.element_size() == 1 else gpu).cpu())
    for activation in ("gelu", "swiglu"):
        h = values(rows, 256, torch.bfloat16, 16, spread=3.0)
        d_a = values(rows, 128 if activation == "swiglu" else 256, torch.bfloat16, 17)
        outs = []
        for d in ("cpu", dev):
            st = ext.LinearState(RECIPES[recipe], d)
            data, cw, sinv, a = ext.activation_forward(h.to(d), activation, st, 0, True, True,
                                                       True, True)
            bw = ext.activation_backward(d_a.to(d), h.to(d), activation, st, 2, True, True, True,
                                         torch.bfloat16 if rows > 1 else None, True)
            outs.append(dict(fp8=[fp8_codes(t) for t in (data, cw, bw[0], bw[1])],
                             values=[f32(a), f32(bw[4])],
                             sums=None if bw[3] is None else f32(bw[3]),
                             scalars=[f32(t) for t in (sinv, bw[2], st.scale, st.amax_history)]))
        cpu, gpu = outs
        # The activation kernels' bound (fp8kit/activation.h).
        for c, g in zip(cpu["values"], gpu["values"]):
            assert_within_activation_bound(c, g)
        for c, g in zip(cpu["fp8"], gpu["fp8"]):
            assert_fp8_near(c, g)
        for c, g in zip(cpu["scalars"], gpu["scalars"]):
            np.testing.assert_allclose(g, c, rtol=2 ** -14)
        if cpu["sums"] is not None:
            dh = np.abs(cpu["values"][1].astype(np.float64))
            bound = (2 ** -18 * dh.sum(0) + 2 ** -20 * dh.max() * rows
                     + 2 ** -7 * np.abs(cpu["sums"]))
            assert np.all(np.abs(gpu["sums"] - cpu["sums"]) <= bound)


def fp8_codes(t: torch.Tensor) -> np.ndarray:
    """An FP8 tensor's bytes, as ints (for code arithmetic)."""
    return t.cpu().view(torch.uint8).numpy().astype(np.int32)


def f32(t: torch.Tensor) -> np.ndarray:
    return to_numpy_f32(t.cpu())


def assert_within_activation_bound(cpu: np.ndarray, gpu: np.ndarray):
    """2^-18 |v| + 2^-20 amax, plus one ulp of bf16 (the outputs' dtype: two
    values within the bound may round to neighbouring bf16 values)."""
    finite = np.isfinite(cpu)
    np.testing.assert_array_equal(np.isfinite(gpu), finite)
    c, g = cpu[finite].astype(np.float64), gpu[finite].astype(np.float64)
    amax = np.abs(c).max() if c.size else 0.0
    assert np.all(np.abs(g - c) <= (2 ** -18 + 2 ** -7) * np.abs(c) + 2 ** -20 * amax)


def assert_fp8_near(cpu: np.ndarray, gpu: np.ndarray):
    """FP8 codes equal or one step apart with the same sign, on at most 1%."""
    differ = cpu != gpu
    sign_ok = ((cpu & 0x80) == (gpu & 0x80)) | (((cpu | gpu) & 0x7F) == 0)
    assert np.all(~differ | (sign_ok & (np.abs((cpu & 0x7F) - (gpu & 0x7F)) <= 1)))
    assert differ.sum() <= 1 + cpu.size // 100
