"""Block-scaled FP8 quantization through the core: one float32 scale per
1x128 tile (activations and gradients) or per 128x128 block (weights).

The rule, per block, is current scaling's (common/include/fp8kit/block_scaling.h
states it exactly, with the scale layout): scale = fp8_max / max(amax,
amax_epsilon), rounded down to a power of two when power_2_scale but never
below fp8_max / FLT_MAX (so no finite value dequantizes to inf); a block of
zeros, or one holding a NaN or an inf, gets scale 1; q = saturate(rne(x *
scale)) for finite x, an inf or NaN element staying non-finite (NaN in
E4M3); only scale_inv = 1 / scale is kept. Bit-identical on CPU and CUDA.
Sharded inputs are quantized shard by shard, each device holding whole
blocks (_sharding_block.py says which shardings are refused).
"""

from __future__ import annotations

import jax.numpy as jnp

from fp8kit.jax import _checks, _ffi
from fp8kit.jax import _sharding_block as shb
from fp8kit.jax.scaled_tensor import ScaledTensor

BLOCK_MODES = ("block_1x128", "block_128x128")


def check_block_mode(fn: str, arg: str, mode) -> str:
    """A block scaling mode name ("block_1x128" or "block_128x128")."""
    if mode not in BLOCK_MODES:
        raise ValueError(f"{fn}: {arg}={mode!r} is not a block scaling mode; use 'block_1x128' "
                         "(activations and gradients) or 'block_128x128' (weights).")
    return mode


def check_block_scales(fn: str, arg: str, st: ScaledTensor) -> None:
    """The block scales of each copy st holds have the core's shape
    (fp8kit_block_scale_inv_shape); st.check has run."""
    for copy, scales, columnwise in (("data", "block_scale_inv", False),
                                     ("columnwise_data", "columnwise_block_scale_inv", True)):
        if getattr(st, copy) is None:
            continue
        want = _ffi.block_scale_inv_shape(st.scaling_mode, st.shape, columnwise)
        got = tuple(getattr(st, scales).shape)
        if got != want:
            raise ValueError(f"{fn}: {arg}.{scales} has shape {got} but {st.scaling_mode} "
                             f"scales of a {st.shape} tensor's {copy} are {want}; make {arg} "
                             "with fp8kit.jax.quantize_block_scaling.")


def quantize_block_scaling(x, fp8_dtype="e4m3", rowwise: bool = True, columnwise: bool = False,
                           scaling_mode: str = "block_1x128", amax_epsilon: float = 0.0,
                           power_2_scale: bool = True) -> ScaledTensor:
    """Quantize `x` with one scale per block, in one pass.

    x:            float32/bfloat16/float16, any rank <= 8, viewed as 2-D
                  [prod(shape[:-1]), shape[-1]].
    fp8_dtype:    "e4m3" / jnp.float8_e4m3fn or "e5m2" / jnp.float8_e5m2.
    rowwise:      produce `data` with `block_scale_inv` (tiles along the last dim).
    columnwise:   produce the transposed `columnwise_data` with its own
                  `columnwise_block_scale_inv` (tiles along the rows).
    scaling_mode: "block_1x128" (activations, gradients) or "block_128x128"
                  (weights: both copies then share the blocks).
    amax_epsilon, power_2_scale: as in fp8kit.recipe.BlockScaling.
    Returns a ScaledTensor with scaling_mode set and scale_inv None.
    """
    fn = "fp8kit.jax.quantize_block_scaling"
    fmt, rowwise, columnwise = _checks.quantize_args(fn, x, fp8_dtype, rowwise, columnwise)
    mode = check_block_mode(fn, "scaling_mode", scaling_mode)
    amax_epsilon = _checks.epsilon(fn, "amax_epsilon", amax_epsilon)
    power_2_scale = _checks.flag(fn, "power_2_scale", power_2_scale)
    x = jnp.asarray(x)
    shb.check_explicit_shards(fn, "x", x, mode, rowwise, columnwise)
    data, columnwise_data, scales, columnwise_scales = shb.quantize_block_scaling(
        x, fmt, rowwise, columnwise, mode, amax_epsilon, power_2_scale)
    return ScaledTensor(data=data if rowwise else None, scale_inv=None,
                        columnwise_data=columnwise_data if columnwise else None,
                        fp8_dtype=fmt, scaling_mode=mode,
                        block_scale_inv=scales if rowwise else None,
                        columnwise_block_scale_inv=columnwise_scales if columnwise else None)
