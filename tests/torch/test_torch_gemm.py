"""fp8kit.torch.gemm (the binding of the core's FP8 GEMM) against a float64
reference of the dequantized operands."""

import numpy as np
import pytest
import torch

import fp8kit.torch as ft
from torch_reference import cuda_or_skip, decode, to_numpy_f32


def q(x, fmt="e4m3", scale=None):
    """(data, columnwise_data, scale_inv, float64 dequantized value)."""
    if scale is None:
        d, dt, _, sinv, _ = ft.quantize_current_scaling(x, fmt, True, True)
    else:
        d, dt, sinv = ft.quantize(x, scale, fmt, True, True)
    return d, dt, sinv, decode(d) * np.float64(sinv.item())


@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_all_layouts_against_float64(trans_a, trans_b, out_dtype):
    m, k, n = 24, 48, 32
    torch.manual_seed(0)
    a = torch.randn((k, m) if trans_a else (m, k))
    b = torch.randn((n, k) if trans_b else (k, n))
    ad, acw, asi, av = q(a)
    bd, bcw, bsi, bv = q(b, "e5m2")
    want = (av.T if trans_a else av) @ (bv.T if trans_b else bv)
    # The core reads whichever copy the (TN-only) CPU reference needs.
    d = ft.gemm(ad, asi, acw, bd, bsi, bcw, trans_a, trans_b, out_dtype)
    assert d.shape == (m, n) and d.dtype == out_dtype
    tol = 1e-5 if out_dtype == torch.float32 else 8e-3
    np.testing.assert_allclose(to_numpy_f32(d), want, rtol=tol, atol=tol * np.abs(want).max())
    # Only the copy that is needed: the other may be None.
    need_a_cw, need_b_cw = trans_a, not trans_b
    d2 = ft.gemm(None if need_a_cw else ad, asi, acw if need_a_cw else None,
                 None if need_b_cw else bd, bsi, bcw if need_b_cw else None, trans_a, trans_b,
                 out_dtype)
    assert torch.equal(d, d2)


def test_rank3_operand_bias_accumulate_and_fp8_output():
    torch.manual_seed(1)
    x = torch.randn(2, 8, 32)
    w = torch.randn(16, 32)
    xd, _, xsi, xv = q(x)
    wd, _, wsi, wv = q(w)
    bias = torch.randn(16).to(torch.bfloat16)
    want = xv.reshape(16, 32) @ wv.T + to_numpy_f32(bias)
    d = ft.gemm(xd, xsi, None, wd, wsi, None, False, True, torch.bfloat16, bias=bias)
    np.testing.assert_allclose(to_numpy_f32(d), want, rtol=8e-3, atol=8e-3 * np.abs(want).max())
    out = torch.ones(16, 16)
    r = ft.gemm(xd, xsi, None, wd, wsi, None, False, True, torch.float32, out=out,
                accumulate=True)
    assert r.data_ptr() == out.data_ptr()
    np.testing.assert_allclose(out.numpy(), xv.reshape(16, 32) @ wv.T + 1.0, rtol=1e-5,
                               atol=1e-5)
    d_scale, d_amax = torch.tensor([2.0]), torch.zeros(1)
    d8 = ft.gemm(xd, xsi, None, wd, wsi, None, False, True, torch.float8_e4m3fn,
                 d_scale=d_scale, d_amax=d_amax)
    exact = xv.reshape(16, 32) @ wv.T
    assert d8.dtype == torch.float8_e4m3fn
    assert d_amax.item() == pytest.approx(np.abs(exact).max(), rel=1e-6)
    np.testing.assert_allclose(decode(d8) / 2.0, exact, rtol=0.07, atol=1e-3)


def test_gelu_epilogue_and_aux():
    torch.manual_seed(2)
    a, b = torch.randn(16, 32), torch.randn(16, 32)
    ad, _, asi, av = q(a)
    bd, _, bsi, bv = q(b)
    aux = torch.empty(16, 16, dtype=torch.bfloat16)
    d = ft.gemm(ad, asi, None, bd, bsi, None, False, True, torch.bfloat16, gelu=True,
                gelu_aux=aux)
    pre = av @ bv.T
    np.testing.assert_allclose(to_numpy_f32(aux), pre, rtol=8e-3, atol=8e-3 * np.abs(pre).max())
    gelu = 0.5 * pre * (1 + np.tanh(0.7978845608028654 * (pre + 0.044715 * pre ** 3)))
    np.testing.assert_allclose(to_numpy_f32(d), gelu, rtol=8e-3, atol=8e-3 * np.abs(pre).max())


def test_errors():
    a = torch.randn(16, 32)
    ad, acw, asi, _ = q(a)
    with pytest.raises(ValueError, match="a and a_columnwise are both None"):
        ft.gemm(None, asi, None, ad, asi, None)
    with pytest.raises(ValueError, match="inner dimensions must match"):
        ft.gemm(ad, asi, None, ad, asi, None, False, False)
    with pytest.raises(TypeError, match="a has dtype torch.float32"):
        ft.gemm(a, asi, None, ad, asi, None, False, True)
    with pytest.raises(ValueError, match="accumulate=True adds into out's old contents"):
        ft.gemm(ad, asi, None, ad, asi, None, False, True, accumulate=True)
    with pytest.raises(ValueError, match="d_scale .* is required"):
        ft.gemm(ad, asi, None, ad, asi, None, False, True, torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"bias has shape \[3\]"):
        ft.gemm(ad, asi, None, ad, asi, None, False, True, bias=torch.zeros(3))
    sd, scw, ssi, _ = q(torch.randn(16, 16))
    with pytest.raises(ValueError, match="has no columnwise data; quantize A with columnwise=True"):
        ft.gemm(ad, asi, None, sd, ssi, scw, True, False)  # TN-only: A^T is read from a_columnwise
    odd = torch.randn(16, 24)
    od, _, osi, _ = q(odd)
    with pytest.raises(ValueError, match="multiple of 16"):
        ft.gemm(od, osi, None, od, osi, None, False, True)


def test_supports_non_tn_on_cpu_is_false():
    assert ft.supports_non_tn_fp8_gemm("cpu") is False


@pytest.mark.gpu
def test_cuda_gemm_against_float64_and_capability():
    dev = cuda_or_skip()
    assert isinstance(ft.supports_non_tn_fp8_gemm(dev), bool)
    cap = torch.cuda.get_device_capability(dev)
    if cap in ((8, 9), (9, 0)):
        assert ft.supports_non_tn_fp8_gemm(dev) is False
    torch.manual_seed(3)
    for trans_a, trans_b in ((False, True), (False, False), (True, False)):
        m, k, n = 256, 512, 384
        a = torch.randn((k, m) if trans_a else (m, k))
        b = torch.randn((n, k) if trans_b else (k, n))
        ad, acw, asi, av = q(a)
        bd, bcw, bsi, bv = q(b)
        want = (av.T if trans_a else av) @ (bv.T if trans_b else bv)
        g = ft.gemm(ad.to(dev), asi.to(dev), acw.to(dev), bd.to(dev), bsi.to(dev), bcw.to(dev),
                    trans_a, trans_b, torch.float32)
        assert g.device == dev
        # Hopper's FP8 tensor cores sum in a ~13-bit accumulator between
        # fp32 promotions: bound the error by a fraction of sum |a||b|.
        abs_a, abs_b = np.abs(av), np.abs(bv)
        bound = 2.0**-11 * ((abs_a.T if trans_a else abs_a) @ (abs_b.T if trans_b else abs_b))
        assert (np.abs(g.cpu().numpy() - want) <= bound + 1e-6).all()


_TUNING_CHILD = """
import torch, fp8kit.torch as ft
torch.manual_seed(0)
a, b = torch.randn(256, 512), torch.randn(384, 512)
def q(x):
    s = torch.finfo(torch.float8_e4m3fn).max / x.abs().max()
    return (x * s).to(torch.float8_e4m3fn), (1 / s).reshape(1).float()
(ad, asi), (bd, bsi) = q(a), q(b)
want = (ad.float() * asi) @ (bd.float() * bsi).T
try:
    g = ft.gemm(ad.cuda(), asi.cuda(), None, bd.cuda(), bsi.cuda(), None, False, True,
                torch.float32)
    print("max err", float((g.cpu() - want).abs().max() / want.abs().max()))
except Exception as e:
    print(type(e).__name__, e)
"""


@pytest.mark.gpu
@pytest.mark.parametrize("env, expect", [
    ({"FP8KIT_GEMM_CANDIDATES": "3"}, "max err"),
    ({"FP8KIT_GEMM_CANDIDATES": "0"}, "ValueError fp8kit: FP8KIT_GEMM_CANDIDATES=\"0\" must be an"),
    ({"FP8KIT_GEMM_CANDIDATES": "4", "FP8KIT_GEMM_LOG": "1"}, "max err"),
], ids=["candidates", "bad-candidates", "log"])
def test_cuda_gemm_candidates_environment(env, expect):
    """FP8KIT_GEMM_CANDIDATES (read once per process, so each case runs in a
    child): a valid count tunes and gives the right product; a bad one is a
    clear error at the first GEMM."""
    import os
    import subprocess
    import sys
    cuda_or_skip()
    child_env = dict(os.environ, **env, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.run([sys.executable, "-c", _TUNING_CHILD], env=child_env,
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout.strip()
    assert proc.returncode == 0 and out.startswith(expect), out + proc.stderr[-3000:]
    if expect == "max err":
        assert float(out.split()[-1]) < 2e-2
    plan_lines = [l for l in proc.stderr.splitlines() if l.startswith("fp8kit gemm plan:")]
    if "FP8KIT_GEMM_LOG" not in env:
        assert plan_lines == []
    else:
        # One GEMM, one new plan: its shape, and a time per timed candidate.
        assert len(plan_lines) == 1, proc.stderr[-3000:]
        line = plan_lines[0]
        assert "M=256 N=384 K=512 A e4m3 B e4m3 D float32" in line, line
        candidates = int(line.split(" of ")[1].split()[0])
        if candidates > 1:
            times = line.split("us per call:")[1].split()
            assert len(times) == candidates and all(float(t) > 0 for t in times), line
