"""fp8kit.torch.cast_statistics (torch.ops.fp8kit.cast_statistics under it)
against the float64 NumPy reference of tests/fp8_reference.py, on the FP8
copies fp8kit's quantizers make: crafted tensors whose underflow and
saturation counts are known by construction (far below and either side of
half the smallest subnormal, exact zeros, clipped and exact fp8_max values,
inf and NaN left out) under a delayed-style per-tensor scale and under
1x128 and 128x128 block scaling; random tensors of every input dtype in
both formats, every mode, rowwise and columnwise; views, empty and 0-d
tensors, a bad scale, sums past FLT_MAX; opcheck and
torch.compile(fullgraph=True); the errors. GPU: CUDA against the CPU."""

import math

import numpy as np
import pytest
import torch
import torch._dynamo.testing

import fp8_reference as ref
import fp8kit.torch as ft
from compile_helpers import fresh_dynamo  # noqa: F401  (autouse fixture)
from torch_reference import DEVICES, assert_bits_equal, cuda_or_skip, device_of

FORMATS = ("e4m3", "e5m2")
BLOCK_MODES = ("block_1x128", "block_128x128")
FIELDS = ("amax", "underflow", "saturated", "error_sq", "norm_sq")
DTYPES = {"amax": torch.float32, "underflow": torch.int64, "saturated": torch.int64,
          "error_sq": torch.float32, "norm_sq": torch.float32}


def quantize(x, fmt, mode, scale=None, rowwise=True, columnwise=True):
    """x's FP8 copy: per-tensor with a given scale (delayed style) or, with
    scale None, current scaling; or block-scaled (power-of-two scales)."""
    if mode == "per_tensor" and scale is not None:
        s = torch.tensor([scale], dtype=torch.float32, device=x.device)
        return ft.Float8Quantizer(s, fmt, rowwise=rowwise, columnwise=columnwise)(x)
    if mode == "per_tensor":
        return ft.Float8CurrentScalingQuantizer(fmt, rowwise, columnwise)(x)
    return ft.Float8BlockQuantizer(fmt, mode, rowwise, columnwise)(x)


def reference(x, q, columnwise: bool) -> dict:
    """fp8_reference.cast_statistics of the copy of q that is read."""
    if isinstance(q, ft.Float8BlockTensor):
        mode = q.scaling_mode
        scales = q.columnwise_block_scale_inv if columnwise else q.block_scale_inv
    else:
        mode, scales = "per_tensor", q.scale_inv
    data = q.columnwise_data if columnwise else q.rowwise_data
    shape = tuple(x.shape)
    bits = ref.logical_bits(data.cpu().view(torch.uint8).numpy(), shape, columnwise)
    scale_inv = ref.element_scale_inv(scales.cpu().numpy(), mode, shape, columnwise)
    return ref.cast_statistics(x.detach().cpu().float().numpy(), bits, q.fp8_dtype, scale_inv)


def values(stats: ft.CastStatistics) -> dict:
    return {name: getattr(stats, name).item() for name in FIELDS}


def check(x, q, columnwise: bool, what: str) -> ft.CastStatistics:
    """cast_statistics against the reference; every field a 0-d tensor of
    its dtype on x's device."""
    got = ft.cast_statistics(x, q, columnwise=columnwise)
    assert isinstance(got, ft.CastStatistics)
    for name in FIELDS:
        t = getattr(got, name)
        assert (t.shape, t.dtype, t.device) == ((), DTYPES[name], x.device), name
    ref.assert_cast_statistics(values(got), reference(x, q, columnwise), what)
    return got


# ------------------------------------------------------------- crafted ----
@pytest.mark.parametrize("columnwise", [False, True])
@pytest.mark.parametrize("specials", ["", "inf", "nan"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fmt", FORMATS)
def test_crafted_per_tensor_counts(fmt, dtype, specials, columnwise):
    # A delayed-style scale of 4: the values past fp8_max / 4 saturate.
    x, underflow, saturated = ref.crafted_per_tensor(fmt, 4.0, specials)
    x = torch.from_numpy(x).to(dtype)
    got = check(x, quantize(x, fmt, "per_tensor", scale=4.0), columnwise, f"{fmt} {dtype}")
    assert (got.underflow.item(), got.saturated.item()) == (underflow, saturated)
    amax = got.amax.item()
    if specials == "nan":  # the canonical quiet NaN, as fp8kit_amax writes it
        assert got.amax.view(torch.int32).item() == 0x7FC00000
    elif specials == "inf":
        assert amax == math.inf
    else:
        assert amax == x.abs().max().item()
    assert math.isfinite(got.error_sq.item()) and math.isfinite(got.norm_sq.item())


@pytest.mark.parametrize("columnwise", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", BLOCK_MODES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_crafted_block_counts(fmt, mode, dtype, columnwise):
    x, underflow, saturated = ref.crafted_blocks(fmt)
    x = torch.from_numpy(x).to(dtype)
    got = check(x, quantize(x, fmt, mode), columnwise, f"{fmt} {mode} {dtype}")
    assert (got.underflow.item(), got.saturated.item()) == (underflow, saturated)
    assert got.amax.view(torch.int32).item() == 0x7FC00000


@pytest.mark.parametrize("mode", BLOCK_MODES)
def test_each_finite_block_amax_lands_on_fp8_max(mode):
    # Without power-of-two rounding a block's scale maps its amax onto
    # fp8_max exactly, so at least one value per block saturates.
    g = torch.Generator().manual_seed(3)
    x = torch.randn(256, 384, generator=g)
    q = ft.Float8BlockQuantizer("e4m3", mode, True, False, 0.0, False)(x)
    blocks = 2 * 3 if mode == "block_128x128" else 256 * 3
    assert check(x, q, False, mode).saturated.item() >= blocks


# -------------------------------------------------------------- random ----
def mixed(shape, seed: int) -> torch.Tensor:
    return torch.from_numpy(ref.mixed_magnitudes(shape, seed))


@pytest.mark.parametrize("columnwise", [False, True])
@pytest.mark.parametrize("shape", [(300, 264), (3, 5, 130)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", ["delayed", "current", *BLOCK_MODES])
@pytest.mark.parametrize("fmt", FORMATS)
def test_random_tensors_match_the_reference(fmt, mode, dtype, shape, columnwise):
    x = mixed(shape, seed=len(shape)).to(dtype)
    if mode == "delayed":  # a stale scale: the top values saturate
        q = quantize(x, fmt, "per_tensor", scale=ref.FP8_MAX[fmt] / (0.5 * x.abs().max().item()))
    else:
        q = quantize(x, fmt, "per_tensor" if mode == "current" else mode)
    got = check(x, q, columnwise, f"{fmt} {mode} {dtype} {shape}")
    assert got.underflow.item() > 0
    assert mode not in ("delayed", "current") or got.saturated.item() > 0


def test_a_copy_that_holds_one_layout():
    x = mixed((64, 48), seed=4)
    rowwise_only = quantize(x, "e4m3", "per_tensor", columnwise=False)
    columnwise_only = quantize(x, "e4m3", "block_1x128", rowwise=False)
    check(x, rowwise_only, False, "rowwise only")
    check(x, columnwise_only, True, "columnwise only")


@pytest.mark.parametrize("view", ["slice", "t", "reshape"])
def test_views_of_a_float8_tensor(view):
    x = mixed((16, 32), seed=5)
    q = quantize(x, "e5m2", "per_tensor")
    take = {"slice": lambda t: t[2:10], "t": lambda t: t.t(),
            "reshape": lambda t: t.reshape(4, 128)}[view]
    for columnwise in (False, True):
        check(take(x), take(q), columnwise, view)


@pytest.mark.parametrize("shape", [(0, 16), (4, 0), ()])
@pytest.mark.parametrize("mode", ["per_tensor", *BLOCK_MODES])
def test_empty_and_0d_tensors(shape, mode):
    x = torch.full(shape, 3.0)
    for columnwise in (False, True):
        got = check(x, quantize(x, "e4m3", mode), columnwise, f"{shape}")
        if x.numel() == 0:
            assert values(got) == dict.fromkeys(FIELDS, 0)


def test_a_bad_scale_makes_error_sq_nan():
    # Every code NaN (fp8kit/quantize.h): the cast lost every element.
    x = mixed((8, 16), seed=6)
    got = check(x, quantize(x, "e4m3", "per_tensor", scale=0.0), False, "scale 0")
    assert math.isnan(got.error_sq.item()) and math.isfinite(got.norm_sq.item())
    assert (got.underflow.item(), got.saturated.item()) == (0, 0)


def test_huge_finite_values_saturate_and_overflow_the_sums():
    x = torch.tensor([[1.0, 1e38], [-2.0, 0.5]])
    got = check(x, quantize(x, "e4m3", "per_tensor", scale=8.0), False, "1e38")
    assert got.saturated.item() == 1 and got.norm_sq.item() == math.inf


def test_derived_values_stay_tensors():
    x = mixed((40, 50), seed=7)
    got = ft.cast_statistics(x, quantize(x, "e4m3", "block_1x128"))
    want = reference(x, quantize(x, "e4m3", "block_1x128"), False)
    assert isinstance(got.relative_error, torch.Tensor)
    assert got.relative_error.item() == pytest.approx(
        math.sqrt(want["error_sq"] / want["norm_sq"]), rel=1e-5)
    assert got.underflow_rate(x.numel()).item() == pytest.approx(want["underflow"] / x.numel())
    assert got.saturation_rate(x.numel()).item() == pytest.approx(want["saturated"] / x.numel())
    zero = ft.cast_statistics(torch.zeros(4, 4), quantize(torch.zeros(4, 4), "e4m3", "per_tensor"))
    assert math.isnan(zero.relative_error.item())  # no signal


def test_x_that_requires_grad_is_read_detached():
    x = mixed((8, 32), seed=8).requires_grad_()
    got = check(x, quantize(x.detach(), "e4m3", "per_tensor"), False, "requires_grad")
    assert not any(getattr(got, name).requires_grad for name in FIELDS)


# ------------------------------------------------------ dispatcher op ----
def _op_args(q, columnwise: bool):
    if isinstance(q, ft.Float8BlockTensor):
        scales = q.columnwise_block_scale_inv if columnwise else q.block_scale_inv
        mode = q.scaling_mode
    else:
        scales, mode = q.scale_inv, "per_tensor"
    return (q.columnwise_data if columnwise else q.rowwise_data), scales, mode


@pytest.mark.parametrize("columnwise", [False, True])
@pytest.mark.parametrize("mode", ["per_tensor", *BLOCK_MODES])
def test_opcheck(mode, columnwise):
    # opcheck's schema test compares with torch.allclose, which has no FP8
    # kernel; the schema declares no mutation, and the FP8 data keeps its bits.
    x = mixed((130, 260), seed=9)
    q = quantize(x, "e4m3", mode)
    data, scales, mode_name = _op_args(q, columnwise)
    before = data.clone()
    torch.library.opcheck(torch.ops.fp8kit.cast_statistics.default,
                          (x, data, scales, mode_name, columnwise),
                          test_utils=("test_autograd_registration", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))
    assert not torch.ops.fp8kit.cast_statistics.default._schema.is_mutable
    assert_bits_equal(data, before)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["per_tensor", *BLOCK_MODES])
def test_compiled_equals_eager(device, mode):
    dev = device_of(device)
    x = mixed((64, 256), seed=10).to(dev)
    q = quantize(x, "e4m3", mode)
    if mode != "per_tensor":
        # Without its quantizer: a Float8BlockTensor's flatten metadata holds
        # it, and with no __metadata_guard__ (Float8Tensor has one) dynamo's
        # guard on that metadata fails on the frame that made it.
        q = ft.Float8BlockTensor(q.rowwise_data, q.block_scale_inv, dtype=x.dtype,
                                 scaling_mode=mode, columnwise_data=q.columnwise_data,
                                 columnwise_block_scale_inv=q.columnwise_block_scale_inv)

    def stats(x, q):
        s = ft.cast_statistics(x, q, columnwise=True)
        return s.amax, s.underflow, s.saturated, s.relative_error

    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    got = torch.compile(stats, backend=counter, fullgraph=True)(x, q)
    for g, w in zip(got, stats(x, q)):
        assert (g.shape, g.dtype, g.device) == (w.shape, w.dtype, w.device)
        assert torch.equal(g, w)
    assert counter.frame_count == 1


# -------------------------------------------------------------- errors ----
def test_bad_arguments_name_the_argument_and_the_fix():
    x = mixed((8, 16), seed=11)
    q = quantize(x, "e4m3", "per_tensor", columnwise=False)
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        ft.cast_statistics([1.0], q)
    with pytest.raises(TypeError, match=r"x is an fp8kit Float8Tensor; pass a plain tensor"):
        ft.cast_statistics(q, q)
    with pytest.raises(TypeError, match=r"x has dtype torch.float64; it is the high-precision"):
        ft.cast_statistics(x.double(), q)
    with pytest.raises(TypeError, match=r"quantized must be an fp8kit Float8Tensor or "
                                        r"Float8BlockTensor .* got a plain torch.float8_e4m3fn "
                                        r"tensor; wrap FP8 data"):
        ft.cast_statistics(x, q.rowwise_data)
    with pytest.raises(TypeError, match="got NoneType"):
        ft.cast_statistics(x, None)
    with pytest.raises(TypeError, match="columnwise=1 must be True or False"):
        ft.cast_statistics(x, q, 1)
    with pytest.raises(ValueError, match=r"x has shape \(8, 8\) but quantized has shape "
                                         r"\(8, 16\); pass the FP8 copy of x itself"):
        ft.cast_statistics(x[:, :8], q)
    with pytest.raises(ValueError, match=r"x is on meta but quantized is on cpu; move one"):
        ft.cast_statistics(x.to("meta"), q)
    with pytest.raises(ValueError, match=r"quantized holds no columnwise copy; read its rowwise "
                                         r"one \(columnwise=False\) or quantize x with a "
                                         r"quantizer made with columnwise=True"):
        ft.cast_statistics(x, q, columnwise=True)


def test_the_dispatcher_op_checks_what_it_is_given():
    op = torch.ops.fp8kit.cast_statistics
    x = mixed((8, 256), seed=12)
    q = quantize(x, "e4m3", "block_1x128")
    with pytest.raises(ValueError, match="fp8kit::cast_statistics: scaling_mode is 'block'; use "
                                         "'per_tensor'"):
        op(x, q.rowwise_data, q.block_scale_inv, "block")
    with pytest.raises(ValueError, match=r"data has shape \[256, 8\] but x has shape \[8, 256\], "
                                         r"whose rowwise copy is \[8, 256\]"):
        op(x, q.columnwise_data, q.columnwise_block_scale_inv, "block_1x128")
    with pytest.raises(ValueError, match=r"scale_inv has shape \[2, 8\] but the copy it scales "
                                         r"has block scales of shape \[1, 256\]"):
        op(x, q.columnwise_data, q.block_scale_inv, "block_1x128", True)
    with pytest.raises(ValueError, match=r"scale_inv has shape \[2, 8\]; it must hold exactly "
                                         r"one float32"):
        op(x, q.rowwise_data, q.block_scale_inv, "per_tensor")
    with pytest.raises(TypeError, match="data has dtype torch.float32; expected FP8 data"):
        op(x, x, q.block_scale_inv, "block_1x128")


# ----------------------------------------------------------------- GPU ----
@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["delayed", "current", *BLOCK_MODES])
@pytest.mark.parametrize("fmt", FORMATS)
def test_cuda_matches_the_cpu(fmt, mode):
    # amax and the counts bit for bit, the sums within the header's 1e-5.
    dev = cuda_or_skip()
    cases = [mixed((1000, 520), seed=13), torch.from_numpy(ref.crafted_blocks(fmt)[0]),
             torch.from_numpy(ref.crafted_per_tensor(fmt, 4.0, "nan")[0])]
    for x in cases:
        for dtype in (torch.float32, torch.bfloat16):
            xd = x.to(dtype)
            if mode == "delayed":
                q = quantize(xd, fmt, "per_tensor", scale=4.0)
            else:
                q = quantize(xd, fmt, "per_tensor" if mode == "current" else mode)
            qd = q.to(dev)
            for columnwise in (False, True):
                want = values(ft.cast_statistics(xd, q, columnwise))
                got = ft.cast_statistics(xd.to(dev), qd, columnwise)
                assert got.amax.device == xd.to(dev).device
                got = values(got)
                what = f"{fmt} {mode} {dtype} {tuple(x.shape)} columnwise={columnwise}"
                assert np.float32(got["amax"]).view(np.uint32) == \
                    np.float32(want["amax"]).view(np.uint32), what
                assert (got["underflow"], got["saturated"]) == \
                    (want["underflow"], want["saturated"]), what
                for total in ("error_sq", "norm_sq"):
                    assert got[total] == pytest.approx(want[total], rel=ref.SUM_RTOL,
                                                       nan_ok=True), what
