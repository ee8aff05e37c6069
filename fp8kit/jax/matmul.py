"""fp8kit.jax.gemm: FP8 GEMM on ScaledTensors through the core (cuBLASLt on
CUDA, the reference on CPU).

Row-major semantics as in fp8kit/gemm.h:
    D[M,N] = (op(A) * a.scale_inv) @ (op(B) * b.scale_inv) (+ bias[N])
    op(A) = A [M,K] (trans_a=False) or A^T (A's data is [K,M], trans_a=True)
    op(B) = B [K,N] (trans_b=False) or B^T (B's data is [N,K], trans_b=True)
With block-scaled operands (both, from quantize_block_scaling) each element
is multiplied by its block's scale_inv instead; cuBLASLt runs that on
Hopper (supports_block_scaled_fp8_gemm), the CPU reference everywhere.

Layout (TN canonicalization): whether a device's FP8 GEMM can read an
operand that is not K-contiguous is the core's answer
(`supports_non_tn_fp8_gemm`, cached per device; False on CPU, Ada and
Hopper); this module keeps no copy of that rule. When the answer is False
each operand is passed in its K-contiguous layout - A's rowwise data when
trans_a is False, else its columnwise data; B's columnwise data when
trans_b is False, else its rowwise data - and a missing layout is reported
here, before lowering. Block-scaled operands are always read K-contiguous
(the block-scaled kernels are TN only), each with the scales of that copy.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fp8kit.jax import _checks, _ffi
from fp8kit.jax import _sharding_gemm as shg
from fp8kit.jax._ffi import BIAS_DTYPE, GemmLayout
from fp8kit.jax.block_quantization import check_block_scales
from fp8kit.jax.scaled_tensor import ScaledTensor

_OUT_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32))


def supports_non_tn_fp8_gemm(device=None) -> bool:
    """The core's answer for `device` (default: default_device()): can its
    FP8 GEMM read operands that are not K-contiguous?

    Under jit the device is not known while tracing, so fp8kit.jax asks for
    the default device; run FP8 GEMMs on another kind of device inside
    `with jax.default_device(that_device):` (a wrong answer is not silent:
    the core then refuses the layout with an error naming the operand)."""
    # The core caches its answer per device (std::call_once); no copy here.
    return _ffi.ext.supports_non_tn_fp8_gemm(*_device_index(device))


def _device_index(device) -> tuple[str, int]:
    if device is None:
        device = _ffi.default_device()
    platform = _ffi.core_platform(device)
    return platform, 0 if platform == "cpu" else int(getattr(device, "local_hardware_id",
                                                             device.id))


def supports_block_scaled_fp8_gemm(device=None) -> bool:
    """The core's answer for `device` (default: default_device()): does it
    run block-scaled FP8 GEMMs? True on the CPU reference and on Hopper with
    cuBLASLt 12.9+; elsewhere fp8kit_gemm refuses them with a message naming
    the device's capability and cuBLASLt version."""
    return _ffi.ext.supports_block_scaled_fp8_gemm(*_device_index(device))


def _operand_buffer(fn: str, name: str, st: ScaledTensor, k_contiguous_is_rowwise: bool,
                    non_tn: bool):
    """(buffer, scales, is_rowwise): the one layout of an operand the GEMM
    reads, with its scales (the copy's block scales, or scale_inv)."""
    if non_tn and not st.block_scaled:
        use_rowwise = st.has_rowwise
    else:
        use_rowwise = k_contiguous_is_rowwise
        held = st.has_rowwise if use_rowwise else st.has_columnwise
        if not held:
            need, flag = ("rowwise", "rowwise=True") if use_rowwise else (
                "columnwise", "columnwise=True")
            raise ValueError(
                f"{fn}: operand {name} must be read K-contiguous on this device (its FP8 GEMM "
                f"runs the TN layout only) and that is {name}'s {need} data, which it does not "
                f"hold. Quantize {name} with {flag}.")
    if not st.block_scaled:
        scales = st.scale_inv
    else:
        scales = st.block_scale_inv if use_rowwise else st.columnwise_block_scale_inv
    return (st.data, scales, True) if use_rowwise else (st.columnwise_data, scales, False)


def gemm_scaled(a: ScaledTensor, b: ScaledTensor, trans_a: bool, trans_b: bool, out_dtype,
                bias, use_split_accumulator: bool, non_tn: bool, fn: str = "fp8kit.jax.gemm"):
    """The GEMM on 2-D ScaledTensors after the argument checks; sharded (see
    _sharding.py) when a mesh is in context."""
    a_buf, a_scales, a_rowwise = _operand_buffer(fn, "a", a, not trans_a, non_tn)
    b_buf, b_scales, b_rowwise = _operand_buffer(fn, "b", b, trans_b, non_tn)
    layout = GemmLayout(bool(trans_a), bool(trans_b), a_rowwise, b_rowwise, jnp.dtype(out_dtype),
                        bias is not None, bool(use_split_accumulator), a.scaling_mode,
                        b.scaling_mode)
    return shg.gemm(layout, a_buf, a_scales, b_buf, b_scales, bias)


def _check_block_gemm(fn, a, b, trans_a, trans_b, out_dtype, use_split_accumulator) -> None:
    """What cuBLASLt's block-scaled GEMM refuses, said before lowering (the
    core says it again, on the CPU too)."""
    if out_dtype not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32)):
        raise TypeError(f"{fn}: out_dtype={out_dtype} but a block-scaled FP8 GEMM writes "
                        "bfloat16 or float32; pass out_dtype=jnp.bfloat16 or jnp.float32.")
    if not use_split_accumulator:
        raise ValueError(f"{fn}: use_split_accumulator=False but cuBLASLt's block-scaled FP8 "
                         "GEMM has no fast-accumulation mode; pass True.")
    m = a.shape[1] if trans_a else a.shape[0]
    n = b.shape[0] if trans_b else b.shape[1]
    mult = _ffi.BLOCK_GEMM_MN_MULTIPLE
    if n % mult or (a.scaling_mode == "block_1x128" and m % mult):
        raise ValueError(f"{fn}: M={m}, N={n}; a block-scaled FP8 GEMM needs N (and M when a "
                         f"is block_1x128) to be a multiple of {mult}. Pad them.")


def gemm(a: ScaledTensor, b: ScaledTensor, trans_a: bool = False, trans_b: bool = False,
         out_dtype=jnp.bfloat16, bias=None, use_split_accumulator: bool = True,
         device=None) -> jax.Array:
    """D = op(A) @ op(B) (+ bias) from FP8 ScaledTensors; see the module doc.

    a:  [M,K] (or [K,M] with trans_a); with trans_a=False it may have more
        leading dims, [..., K] -> D [..., N].
    b:  [K,N] (or [N,K] with trans_b).
    out_dtype: bfloat16, float16 or float32.
    bias: [N], bfloat16 for bf16/fp32 output, float16 for fp16 output.
    Block-scaled a and b (one block_128x128 at most): out_dtype bfloat16 or
    float32, use_split_accumulator True, N (and M for a 1x128 a) a multiple
    of 8.
    use_split_accumulator: promote partial sums to FP32 (accurate); False
        uses the tensor cores' fast accumulation.
    device: whose layout rules apply (default: the default device, see
        supports_non_tn_fp8_gemm).
    K must be a positive multiple of the core's GEMM_DIM_MULTIPLE and each
    output row a multiple of 16 bytes
    (cuBLASLt's FP8 rules, enforced on CPU too).
    """
    fn = "fp8kit.jax.gemm"
    for name, st in (("a", a), ("b", b)):
        if not isinstance(st, ScaledTensor):
            raise TypeError(f"{fn}: {name} must be an fp8kit.jax.ScaledTensor (from "
                            f"fp8kit.jax.quantize), got {type(st).__name__}")
        st.check(fn, name)
        if st.block_scaled:
            check_block_scales(fn, name, st)
    if a.block_scaled != b.block_scaled:
        per_tensor = "b" if a.block_scaled else "a"
        raise ValueError(f"{fn}: a is {a.scaling_mode} but b is {b.scaling_mode}; block-scaled "
                         f"operands multiply only block-scaled operands. Quantize {per_tensor} "
                         "with fp8kit.jax.quantize_block_scaling too.")
    if a.scaling_mode == b.scaling_mode == "block_128x128":
        raise ValueError(f"{fn}: a and b are both block_128x128; cuBLASLt multiplies 1x128 x "
                         "1x128, 1x128 x 128x128 and 128x128 x 1x128 only. Quantize the "
                         "activation or gradient operand with scaling_mode='block_1x128'.")
    trans_a = _checks.flag(fn, "trans_a", trans_a)
    trans_b = _checks.flag(fn, "trans_b", trans_b)
    use_split_accumulator = _checks.flag(fn, "use_split_accumulator", use_split_accumulator)
    if a.fp8_dtype == "e5m2" and b.fp8_dtype == "e5m2":
        raise TypeError(f"{fn}: a and b are both e5m2; FP8 GEMMs take e4m3 x e4m3, e4m3 x e5m2 "
                        "or e5m2 x e4m3. Quantize one operand (usually the forward one) as e4m3.")
    out_dtype = _checks.high_precision_dtype(fn, "out_dtype", out_dtype, _OUT_DTYPES)
    lead = ()
    if a.ndim > 2 and not trans_a:
        lead = a.shape[:-1]
        a = a.as_2d()
    for name, st in (("a", a), ("b", b)):
        if st.ndim != 2:
            raise ValueError(f"{fn}: {name} has shape {st.shape}; it must be 2-D (a may have "
                             "extra leading dims only when trans_a is False)")
    k_a = a.shape[0] if trans_a else a.shape[1]
    k_b = b.shape[1] if trans_b else b.shape[0]
    n = b.shape[0] if trans_b else b.shape[1]
    if k_a != k_b:
        raise ValueError(f"{fn}: inner dimensions differ: op(a) is {'a^T' if trans_a else 'a'} "
                         f"with K={k_a} (a.shape={a.shape}, trans_a={trans_a}) but op(b) has "
                         f"K={k_b} (b.shape={b.shape}, trans_b={trans_b})")
    multiple = _ffi.GEMM_DIM_MULTIPLE
    if k_a % multiple != 0 or k_a == 0:
        raise ValueError(f"{fn}: K={k_a} must be a positive multiple of {multiple} for FP8 "
                         "GEMMs; pad the reduction dimension with zeros.")
    row_bytes = _ffi.GEMM_ROW_BYTES_MULTIPLE
    if (n * out_dtype.itemsize) % row_bytes != 0:
        raise ValueError(f"{fn}: N={n} gives {out_dtype} output rows of "
                         f"{n * out_dtype.itemsize} bytes; FP8 GEMMs need a multiple of "
                         f"{row_bytes} bytes (N a multiple of {row_bytes // out_dtype.itemsize}). "
                         "Pad N.")
    if bias is not None:
        _checks.array(fn, "bias", bias)
        want = BIAS_DTYPE[out_dtype]
        if jnp.dtype(bias.dtype) != want or tuple(bias.shape) != (n,):
            raise ValueError(f"{fn}: bias must be {want} of shape ({n},) for {out_dtype} "
                             f"output; got {jnp.dtype(bias.dtype)} {tuple(bias.shape)}")
    if a.block_scaled:
        _check_block_gemm(fn, a, b, trans_a, trans_b, out_dtype, use_split_accumulator)
    non_tn = supports_non_tn_fp8_gemm(device)
    d = gemm_scaled(a, b, trans_a, trans_b, out_dtype, bias, use_split_accumulator, non_tn, fn)
    if lead:
        d = d.reshape(*lead, n)
    return d
