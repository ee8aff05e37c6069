"""fp8kit.torch block-scaled quantization and dequantization, bit-exact
against the NumPy model of common/include/fp8kit/block_scaling.h in
block_reference.py: all bfloat16 patterns inside tiles and blocks, random
data with an outlier per block, zero and non-finite blocks, edge blocks,
epsilon and power-of-two scales, both formats, both copies, the scale
layout with its padding; the dispatcher op and the quantizer object give the
same bits; bad arguments give clear errors."""

import numpy as np
import pytest
import torch

import fp8kit.torch as ft
from block_reference import (assert_bits_equal, dequantize_stored, quantize,
                             stored_copy)
from torch_reference import all_bf16, cuda_or_skip

MODES = ("block_1x128", "block_128x128")


def check_both_copies(x, fmt="e4m3", mode="block_1x128", eps=0.0, pow2=True):
    data, sinv, cw, cw_sinv = ft.quantize_block(x, fmt, mode, True, True, eps, pow2)
    for columnwise, q, s in ((False, data, sinv), (True, cw, cw_sinv)):
        bits, scales = quantize(x, fmt, mode, columnwise, eps, pow2)
        what = f"{mode} {fmt} {'columnwise' if columnwise else 'rowwise'}"
        assert_bits_equal(q, bits, stored_copy(x, columnwise), what)
        np.testing.assert_array_equal(s.numpy().view(np.uint32), scales.view(np.uint32),
                                      err_msg=f"{what}: block scales (layout and padding)")
    return data, sinv, cw, cw_sinv


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_every_bf16_pattern_inside_blocks(mode, fmt):
    sorted_ = all_bf16()  # one row of 128 is all inf/NaN; the others span every binade
    perm = torch.randperm(sorted_.numel(), generator=torch.Generator().manual_seed(0))
    for x in (sorted_.reshape(512, 128), sorted_[perm].reshape(256, 256)):
        check_both_copies(x, fmt, mode)


def with_outlier_per_block(rows, cols, block_rows, seed):
    """Normal data with one outlier (|x| in 1e2..1e5) at a random place in
    every block_rows x 128 block."""
    g = np.random.default_rng(seed)
    x = g.standard_normal((rows, cols)).astype(np.float32)
    for r0 in range(0, rows, block_rows):
        for c0 in range(0, cols, 128):
            r = r0 + g.integers(min(block_rows, rows - r0))
            c = c0 + g.integers(min(128, cols - c0))
            x[r, c] = g.choice([-1.0, 1.0]) * 10 ** g.uniform(2, 5)
    return torch.from_numpy(x)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("pow2", [True, False])
def test_random_data_with_an_outlier_per_block(mode, pow2):
    # 300 x 264: edge tiles and blocks in both directions.
    x = with_outlier_per_block(300, 264, 128 if mode == "block_128x128" else 1, seed=1)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        check_both_copies(x.to(dtype), "e4m3", mode, pow2=pow2)
    check_both_copies(x, "e5m2", mode, eps=1e3, pow2=pow2)  # eps above many blocks' amax
    check_both_copies(x.t(), "e4m3", mode, pow2=pow2)  # a non-contiguous input


@pytest.mark.parametrize("mode", MODES)
def test_zero_and_non_finite_blocks(mode):
    x = torch.randn(256, 512, generator=torch.Generator().manual_seed(2)) * 100
    x[:128, 0:128] = 0                      # a zero block / 128 zero tiles: scale 1, q 0
    x[5, 130] = float("nan")                 # NaN: the block is cast unscaled
    x[200, 300] = float("inf")
    x[201, 301] = -float("inf")
    x[250, 400] = 1e38                      # finite, far beyond fp8 max: a tiny scale
    data, sinv, cw, cw_sinv = check_both_copies(x, "e4m3", mode)
    # The rule's visible consequences, stated directly as well.
    assert (data[:128, :128].view(torch.uint8) == 0).all()
    assert data[5, 130].view(torch.uint8) == 0x7F            # NaN stays NaN
    assert data[200, 300].view(torch.uint8) == 0x7F          # +inf: NaN (E4M3 has no inf)
    assert data[201, 301].view(torch.uint8) == 0x7F          # -inf too
    if mode == "block_1x128":                                # scale 1: zero and non-finite tiles
        assert sinv[0, 0] == 1 and sinv[1, 5] == 1 and sinv[2, 200] == 1


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(), (7,), (3, 5, 200), (129, 1), (1, 129), (0, 128)])
def test_shapes_and_edge_blocks(mode, shape):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(3)) * 10
    check_both_copies(x, "e4m3", mode)
    assert ft.block_scale_inv_shape(shape, mode) == quantize(x, "e4m3", mode, False)[1].shape
    assert (ft.block_scale_inv_shape(shape, mode, columnwise=True)
            == quantize(x, "e4m3", mode, True)[1].shape)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dequantize_both_copies(mode, out_dtype):
    x = torch.randn(2, 150, 200, generator=torch.Generator().manual_seed(4)) * 30
    data, sinv, cw, cw_sinv = ft.quantize_block(x, "e4m3", mode, True, True)
    for columnwise, q, s in ((False, data, sinv), (True, cw, cw_sinv)):
        bits, scales = quantize(x, "e4m3", mode, columnwise)
        want = dequantize_stored(bits, scales, "e4m3", mode).astype(np.float32)  # exact
        want = want.T if columnwise else want
        got = ft.dequantize_block(q, s, mode, out_dtype, columnwise,
                                  x.shape if columnwise else None)
        assert got.shape == x.shape and got.dtype == out_dtype
        torch.testing.assert_close(got, torch.from_numpy(want.reshape(x.shape)).to(out_dtype),
                                   rtol=0, atol=0)


def test_quantizer_object_and_dispatcher_op_give_the_same_bits():
    x = torch.randn(96, 384, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(5))
    for mode in MODES:
        t = ft.Float8BlockQuantizer("e4m3", mode, power_2_scale=False)(x)
        d, s, cw, cws = torch.ops.fp8kit.quantize_block(x, torch.float8_e4m3fn, mode, True, True,
                                                        0.0, False)
        for a, b in ((t.rowwise_data, d), (t.block_scale_inv, s), (t.columnwise_data, cw),
                     (t.columnwise_block_scale_inv, cws)):
            assert torch.equal(a.view(torch.uint8) if a.dtype != torch.float32 else a,
                               b.view(torch.uint8) if b.dtype != torch.float32 else b)
        none = torch.ops.fp8kit.quantize_block(x, torch.float8_e4m3fn, mode, True, False)
        assert none[2].shape == (0,) and none[3].shape == (0,)


def test_bad_arguments_name_the_fix():
    x = torch.randn(4, 256)
    with pytest.raises(TypeError, match="x has dtype torch.float64"):
        ft.quantize_block(x.double())
    with pytest.raises(TypeError, match="x has dtype torch.int32"):
        ft.quantize_block(x.int())
    with pytest.raises(ValueError, match="scaling_mode is 'block_1x32'; use 'block_1x128'"):
        ft.quantize_block(x, "e4m3", "block_1x32")
    with pytest.raises(ValueError, match="fp8_dtype is 'e3m4'"):
        ft.quantize_block(x, "e3m4")
    with pytest.raises(ValueError, match="rowwise and columnwise are both False"):
        ft.quantize_block(x, rowwise=False)
    with pytest.raises(ValueError, match="amax_epsilon is -1"):
        ft.quantize_block(x, amax_epsilon=-1.0)
    data, sinv, _, _ = ft.quantize_block(x)
    with pytest.raises(ValueError, match=r"block_scale_inv has shape \[2, 2\] but the copy it "
                                         r"scales has block scales of shape \[2, 4\]"):
        ft.dequantize_block(data, sinv[:, :2].contiguous(), "block_1x128")
    with pytest.raises(ValueError, match=r"has block scales of shape \[1, 4\]"):
        ft.dequantize_block(data, sinv, "block_128x128")  # the other mode's layout
    with pytest.raises(TypeError, match="block scales are torch.float32"):
        ft.dequantize_block(data, sinv.double(), "block_1x128")
    with pytest.raises(TypeError, match="data has dtype torch.float32"):
        ft.dequantize_block(x, sinv, "block_1x128")
    with pytest.raises(TypeError, match="Float8BlockTensor"):
        ft.quantize_block(ft.Float8BlockQuantizer()(x))


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
def test_cuda_quantization_matches_the_cpu_bit_for_bit(mode):
    dev = cuda_or_skip()
    g = torch.Generator().manual_seed(6)
    for x in (all_bf16().reshape(256, 256), torch.randn(1000, 520, generator=g) * 50):
        cpu = ft.quantize_block(x, "e4m3", mode, True, True)
        gpu = ft.quantize_block(x.to(dev), "e4m3", mode, True, True)
        for a, b in zip(cpu, gpu):
            assert torch.equal(_bits(a), _bits(b.cpu()))
        back = ft.dequantize_block(gpu[2], gpu[3], mode, torch.float32, True, x.shape)
        # Bits, not values: the bf16 patterns dequantize to NaNs too.
        assert torch.equal(_bits(back.cpu()), _bits(ft.dequantize_block(
            cpu[2], cpu[3], mode, torch.float32, True, x.shape)))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.uint8)
