"""Output checks made before anything is timed: a row whose fp8kit output
disagrees with the anchor's is reported and not timed."""

from __future__ import annotations


class Mismatch(Exception):
    """fp8kit's output disagrees with the anchor's (the row is not timed)."""


def _is_torch(x) -> bool:
    return hasattr(x, "detach")


def _np64(x):
    """A JAX (or NumPy) array as float64 NumPy (bf16 goes through ml_dtypes)."""
    import numpy as np
    return np.asarray(x).astype(np.float64)


def max_rel_diff(got, want) -> float:
    """max |got - want| / max |want| in float64 (torch tensors on their
    device, or JAX/NumPy arrays)."""
    if _is_torch(got):
        g, w = got.double(), want.double()
        return ((g - w).abs().max() / w.abs().max().clamp_min(1e-30)).item()
    g, w = _np64(got), _np64(want)
    return float(abs(g - w).max() / max(abs(w).max(), 1e-30))


def norm_rel_err(got, want) -> float:
    """||got - want|| / ||want|| in float64: the FP8 error of a GEMM output
    with random inputs is a few percent of the norm."""
    if _is_torch(got):
        g, w = got.double(), want.double()
        return ((g - w).norm() / w.norm().clamp_min(1e-30)).item()
    import numpy as np
    g, w = _np64(got), _np64(want)
    return float(np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30))


def within(what: str, err: float, tol: float, kind: str) -> str:
    """Raises Mismatch unless err <= tol; returns the check's description."""
    if not (err <= tol):  # NaN fails
        raise Mismatch(f"{what}: {kind} {err:.3g} > {tol:g}")
    return f"{kind} {err:.2g}<={tol:g}"


def same_fp8(what: str, got, want) -> str:
    """Bit-exact equality of two FP8 torch tensors."""
    if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
        raise Mismatch(f"{what}: got {got.dtype} {tuple(got.shape)}, want {want.dtype} "
                       f"{tuple(want.shape)}")
    import torch
    diff = (got.view(torch.uint8) != want.view(torch.uint8)).sum().item()
    if diff:
        raise Mismatch(f"{what}: {diff} of {got.numel()} bytes differ")
    return "bit-exact"


def close_fp8(what: str, got, want, max_fraction: float = 1e-3) -> str:
    """Two FP8 tensors from different implementations of the same math (a
    peer's scale may differ from fp8kit's in the last bit): at most
    max_fraction of the bytes differ, each by one code (the neighbouring
    FP8 value)."""
    import torch
    if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
        raise Mismatch(f"{what}: got {got.dtype} {tuple(got.shape)}, want {want.dtype} "
                       f"{tuple(want.shape)}")
    d = (got.view(torch.uint8).int() - want.view(torch.uint8).int()).abs()
    n_diff = (d != 0).sum().item()
    if n_diff == 0:
        return "bit-exact"
    if d.max().item() > 1 or n_diff > max_fraction * got.numel():
        raise Mismatch(f"{what}: {n_diff} of {got.numel()} bytes differ (max code distance "
                       f"{d.max().item()})")
    return f"{n_diff} of {got.numel()} bytes one code apart"


def fp8_copies(what: str, out, want, tol: float) -> str:
    """A fused cast's outputs (rowwise data, columnwise data, scale_inv, ...):
    the columnwise copy is the rowwise one transposed, bit for bit, and the
    rowwise copy dequantized is within `tol` of `want` (float64)."""
    data, columnwise, scale_inv = out[0], out[1], out[2]
    same_fp8(f"{what} columnwise", columnwise, data.t().contiguous())
    err = norm_rel_err(data.float().double() * scale_inv.double(), want)
    within(f"{what} output", err, tol, "rel err")
    return f"columnwise = rowwise.T bit-exact; vs float64 rel err {err:.2g}<={tol:g}"
