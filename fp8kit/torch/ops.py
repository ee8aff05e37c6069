"""fp8kit.torch's functional API: thin checked wrappers over the C++
bindings in fp8kit._torch_ext (one call each into the core's C API).

Scale convention (common/include/fp8kit/tensor.h):
    q = saturate(round_to_nearest_even(x * scale)),  x ~= q * scale_inv,
saturating finite values only (+-inf -> NaN in E4M3, +-inf in E5M2).
Outputs are allocated by PyTorch on the input's device; CUDA work runs on
PyTorch's current stream. Inputs that are not contiguous are copied to a
contiguous tensor first.

These functions are pybind11 calls, invisible to PyTorch's dispatcher:
torch.compile breaks the graph at each. The same kernels are also
registered with the dispatcher as torch.ops.fp8kit.<op> (available after
`import fp8kit.torch`), and those are what torch.compile traces, with fake
kernels in fp8kit.torch._fake_ops:
    amax(x) -> Tensor
    quantize(x, scale, fp8_dtype, rowwise, columnwise)
        -> (data, columnwise_data, scale_inv, amax)
    quantize_current_scaling(x, fp8_dtype, rowwise, columnwise,
                             amax_epsilon=0., power_2_scale=False)
        -> (data, columnwise_data, scale, scale_inv, amax)
    dequantize(data, scale_inv, out_dtype, from_columnwise=False, shape=None)
    columnwise_from_rowwise(data) -> Tensor
    gemm(a, a_scale_inv, a_columnwise, b, b_scale_inv, b_columnwise, trans_a,
         trans_b, out_dtype, bias=None, gelu=False, use_split_accumulator=True,
         d_scale=None) -> Tensor
    delayed_scaling_update(amax_histories, amaxes, scales, scale_invs,
                           fp8_dtypes, margin=0, amax_reduction="max") -> None
They differ from the functions here only where a schema must: fp8_dtype is
a torch dtype (torch.float8_e4m3fn / torch.float8_e5m2; fp8_dtypes of
delayed_scaling_update stay "e4m3" / "e5m2"), a layout not asked for is an
empty tensor of shape [0] in the FP8 dtype instead of None, quantize returns
the amax (float32 [1]) instead of writing amax_out, gemm has no out,
accumulate, gelu_aux or d_amax, and scale is a tensor, never a number.
delayed_scaling_update mutates amax_histories, scales and scale_invs in
place, and its schema declares it. fp8kit.torch.Linear's two steps are
dispatcher ops too, linear_forward and linear_backward (what torch.compile
traces of the layer: see fp8kit.torch._traced_linear).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from fp8kit.torch import _checks
from fp8kit.torch._ext import ext


def amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| over the whole tensor, as a float32 0-d tensor on x.device.

    A NaN anywhere gives NaN, +-inf gives inf, an empty tensor gives 0.
    x must be float32, bfloat16 or float16.
    """
    _checks.tensor("fp8kit.torch.amax", "x", x)
    return ext.amax(x)


def _scale_tensor(fn: str, arg: str, scale, like: torch.Tensor) -> torch.Tensor:
    if isinstance(scale, (int, float)):
        return torch.tensor([float(scale)], dtype=torch.float32, device=like.device)
    _checks.tensor(fn, arg, scale)
    return scale


def quantize(x: torch.Tensor, scale, fp8_dtype: str = "e4m3", rowwise: bool = True,
             columnwise: bool = False, amax_out: Optional[torch.Tensor] = None):
    """Quantizes x with a given per-tensor scale (delayed scaling).

    Returns (data or None, columnwise_data or None, scale_inv): data has x's
    shape, columnwise_data is the [x.shape[-1], prod(x.shape[:-1])] copy
    (ext.columnwise_shape), both in
    torch.float8_e4m3fn / torch.float8_e5m2; scale_inv = 1/scale. `scale`
    is a float32 tensor of one element on x.device (or a Python number).
    amax_out, when given, receives max|x|.
    """
    fn = "fp8kit.torch.quantize"
    _checks.tensor(fn, "x", x)
    _checks.fp8_name(fn, "fp8_dtype", fp8_dtype)
    scale = _scale_tensor(fn, "scale", scale, x)
    _checks.tensor(fn, "amax_out", amax_out, allow_none=True)
    return ext.quantize(x, scale, fp8_dtype, bool(rowwise), bool(columnwise), amax_out)


def quantize_current_scaling(x: torch.Tensor, fp8_dtype: str = "e4m3", rowwise: bool = True,
                             columnwise: bool = False, amax_epsilon: float = 0.0,
                             power_2_scale: bool = False):
    """Current scaling: scale = fp8_max / max(amax(x), amax_epsilon), rounded
    down to a power of two if asked, 1 for a zero or non-finite amax.

    Returns (data or None, columnwise_data or None, scale, scale_inv, amax).
    """
    fn = "fp8kit.torch.quantize_current_scaling"
    _checks.tensor(fn, "x", x)
    _checks.fp8_name(fn, "fp8_dtype", fp8_dtype)
    return ext.quantize_current_scaling(x, fp8_dtype, bool(rowwise), bool(columnwise),
                                        float(amax_epsilon), bool(power_2_scale))


def dequantize(data: torch.Tensor, scale_inv: torch.Tensor,
               out_dtype: torch.dtype = torch.float32, from_columnwise: bool = False,
               shape: Optional[Sequence[int]] = None) -> torch.Tensor:
    """data * scale_inv in out_dtype (float32, bfloat16 or float16).

    With from_columnwise=True, data is the transposed [last, prod(leading)]
    copy and the result has `shape` (default: the 2-D transpose of data).
    """
    fn = "fp8kit.torch.dequantize"
    _checks.tensor(fn, "data", data)
    _checks.tensor(fn, "scale_inv", scale_inv)
    _checks.dtype(fn, "out_dtype", out_dtype)
    return ext.dequantize(data, scale_inv, out_dtype, bool(from_columnwise),
                          None if shape is None else [int(s) for s in shape])


def columnwise_from_rowwise(data: torch.Tensor) -> torch.Tensor:
    """The columnwise copy of FP8 `data`: its [prod(leading dims), last dim]
    view transposed, byte for byte (what quantize(..., columnwise=True)
    would have written), for FP8 data that arrives rowwise only."""
    fn = "fp8kit.torch.columnwise_from_rowwise"
    _checks.tensor(fn, "data", data)
    return ext.columnwise_from_rowwise(data)


def delayed_scaling_update(amax_histories, amaxes, scales, scale_invs, fp8_dtypes,
                           margin: int = 0, amax_reduction: str = "max") -> None:
    """Updates many tensors' delayed-scaling state in one call, in place:
    roll each history (h[0] = amax), reduce it (amax_reduction: 'max' or
    'most_recent'), scale = fp8_max / amax_reduced / 2**margin when that
    amax is finite and > 0 (else the previous scale), scale_inv = 1/scale.
    """
    fn = "fp8kit.torch.delayed_scaling_update"
    lists = (amax_histories, amaxes, scales, scale_invs, fp8_dtypes)
    for name, v in zip(("amax_histories", "amaxes", "scales", "scale_invs", "fp8_dtypes"), lists):
        if not isinstance(v, (list, tuple)):
            raise TypeError(f"{fn}: {name} must be a list, got {type(v).__name__}")
    for i, name in enumerate(fp8_dtypes):
        _checks.fp8_name(fn, f"fp8_dtypes[{i}]", name)
    if isinstance(margin, bool) or not isinstance(margin, int):
        raise TypeError(f"{fn}: margin is {margin!r} ({type(margin).__name__}); pass an int "
                        f"in [0, {ext.MARGIN_MAX}]")
    if amax_reduction not in ext.AMAX_REDUCTION_CODES:
        raise ValueError(f"{fn}: amax_reduction is {amax_reduction!r}; pass one of "
                         f"{sorted(ext.AMAX_REDUCTION_CODES)}")
    ext.delayed_scaling_update(list(amax_histories), list(amaxes), list(scales),
                               list(scale_invs), list(fp8_dtypes), margin, amax_reduction)


def gemm(a, a_scale_inv, a_columnwise, b, b_scale_inv, b_columnwise, trans_a: bool = False,
         trans_b: bool = False, out_dtype: torch.dtype = torch.bfloat16, bias=None,
         gelu: bool = False, gelu_aux=None, accumulate: bool = False,
         use_split_accumulator: bool = True, d_scale=None, d_amax=None, out=None):
    """D = (op(a) * a_scale_inv) @ (op(b) * b_scale_inv) (+ bias) (then GELU).

    a / b: rowwise FP8 data or None; a_columnwise / b_columnwise: their
    columnwise copies or None. The core reads whichever copy the device's FP8 GEMM can take
    (see common/include/fp8kit/gemm.h).
    """
    fn = "fp8kit.torch.gemm"
    for name, v in (("a", a), ("a_columnwise", a_columnwise), ("b", b),
                    ("b_columnwise", b_columnwise), ("bias", bias),
                    ("gelu_aux", gelu_aux), ("d_scale", d_scale), ("d_amax", d_amax),
                    ("out", out)):
        _checks.tensor(fn, name, v, allow_none=True)
    _checks.tensor(fn, "a_scale_inv", a_scale_inv)
    _checks.tensor(fn, "b_scale_inv", b_scale_inv)
    for name, v in (("b", b), ("b_columnwise", b_columnwise)):
        if v is not None and v.dim() != 2:  # a weight: one matrix, not a batch of them
            raise ValueError(f"{fn}: {name} has shape {tuple(v.shape)}; b is one 2-D matrix "
                             "(its columnwise copy too)")
    _checks.dtype(fn, "out_dtype", out_dtype)
    return ext.gemm(a, a_scale_inv, a_columnwise, b, b_scale_inv, b_columnwise, bool(trans_a),
                    bool(trans_b), out_dtype, bias, bool(gelu), gelu_aux, bool(accumulate),
                    bool(use_split_accumulator), d_scale, d_amax, out)


def supports_non_tn_fp8_gemm(device) -> bool:
    """Whether FP8 GEMMs on `device` accept non-TN layouts (the core's cached
    per-device answer: False on CPU, Ada and Hopper)."""
    return ext.supports_non_tn_fp8_gemm(torch.device(device))


def built_with_cuda() -> bool:
    """True when fp8kit._torch_ext and the core were built with CUDA."""
    return ext.built_with_cuda()
