"""Quantization section (target P2): per-tensor bf16 -> e4m3
quantization, against the bandwidth limit measured in the same run.

The limit is a device-to-device copy of the same bf16 tensor (read 2 B +
write 2 B per element), timed in the same alternating rounds as fp8kit.
Bytes are counted as the targets count them:

  delayed scaling, cast+transpose   read 2 + write 1 (rowwise) + 1 (columnwise) = 4 B/el;
                                    target P2: a fraction of copy bandwidth.
  delayed scaling, rowwise only     3 B/el (information).
  current scaling, cast+transpose   needs the amax before it can cast: two passes over the
                                    input, 6 B/el moved at best; counted as 4 B/el, its limit
                                    is copy bandwidth x 4/6. Target P2: a fraction of that
                                    limit.
  block scaling, row+col            quantize_block 1x128 (activations, gradients) and 128x128
                                    (weights), both copies in one pass: 4 B/el (the float32
                                    block scales, at most 1/16 B/el, are not counted).
                                    Target P6-quantize: a fraction of copy bandwidth.

Peers (information): the same current-scaling cast+transpose written in
eager PyTorch and, in the full mode, compiled with torch.compile; and, in
the full mode, the delayed-scaling cast+transpose (amax, cast with the
given scale, transpose) compiled with torch.compile. Compiled with
dynamic=False: kernels specialized to each shape, the peer's best case.
Before timing, fp8kit's outputs are compared bit for bit with PyTorch's
own cast (x.float() * scale, clamped, .to(float8_e4m3fn): round to nearest
even, saturating), its transpose and its amax; scale and scale_inv with
IEEE float32 division on the CPU (on CUDA, torch computes 448 / t as 448 *
reciprocal(t), not the correctly rounded quotient fp8kit gives). fp8kit's
ops allocate their outputs on every call (cheap with PyTorch's caching
allocator); the times include that, as the peers' do.
"""

from __future__ import annotations

from fp8kit.bench import checks, timing
from fp8kit.bench.context import Case, Context, shape_cases
from fp8kit.bench.gemm import cast_e4m3
from fp8kit.bench.results import Row

SECTION = "quantize"
TARGET_SHAPES = [(8192, 8192), (16384, 8192), (8192, 28672)]  # P2's shapes
SHAPES = [(4096, 4096)] + TARGET_SHAPES
QUICK_SHAPES = [(128, 256), (512, 384)]

G_DELAYED = "delayed scaling cast+transpose (bf16 -> e4m3 row+col, amax), vs copy"
G_ROWWISE = "delayed scaling rowwise only (3 B/el), vs copy"
G_CURRENT = "current scaling cast+transpose (two-pass), vs its limit"
G_EAGER = "current scaling cast+transpose vs torch eager"
G_COMPILE = "current scaling cast+transpose vs torch.compile"
G_COMPILE_DELAYED = "delayed scaling cast+transpose vs torch.compile"
G_BLOCK = "1x128 and 128x128 block quantization (bf16 -> e4m3 row+col, scales), vs copy"
BLOCK_MODES = ("block_1x128", "block_128x128")
BLOCK_TOL = 2.0 ** -4   # ||dequantized - x|| / ||x||: E4M3 rounds by <= 2^-4


def _torch_delayed_cast_transpose(x, scale):
    """Delayed scaling in PyTorch: the amax (for the history), the cast with
    the given scale and its transpose."""
    amax = x.abs().amax().float()
    q = cast_e4m3(x, scale)
    return q, q.t().contiguous(), amax


def _exact(what: str, got, want) -> None:
    """A float32 scalar tensor equal, bit for bit, to the CPU float32 `want`."""
    g = got.float().reshape(()).cpu()
    if not bool(g == want.reshape(())):
        raise checks.Mismatch(f"{what} {g.item()!r} != {want.item()!r}")


def _torch_amax_cast_transpose(x):
    """What a PyTorch user writes for current scaling: amax, scale, cast, transpose."""
    import torch
    amax = x.abs().amax().float()
    scale = torch.finfo(torch.float8_e4m3fn).max / amax
    q = cast_e4m3(x, scale)
    return q, q.t().contiguous(), (1.0 / scale), amax


def bf16_inputs(rows_: int, cols: int, dev: str, seed: int):
    """(xs, copy): enough random bf16 [rows_, cols] copies to rotate past the
    L2 at 4 B/element, and copy(i), the device-to-device copy of xs[i] that
    is the bandwidth limit of the rows timed against it."""
    import torch
    g = torch.Generator(device=dev).manual_seed(seed)
    copies = timing.copies_for_l2(4 * rows_ * cols)
    xs = [torch.randn(rows_, cols, device=dev, dtype=torch.bfloat16, generator=g)
          for _ in range(copies)]
    dsts = [torch.empty_like(x) for x in xs]
    return xs, lambda i: dsts[i % copies].copy_(xs[i % copies])


def run_shape(ctx: Context, rows_: int, cols: int, seed: int) -> list[Row]:
    import torch
    from fp8kit import _torch_ext as ext

    dev = ctx.torch_device
    n = rows_ * cols
    xs, copy = bf16_inputs(rows_, cols, dev, seed)
    copies = len(xs)
    amaxes = [torch.zeros(1, device=dev, dtype=torch.float32) for _ in xs]
    # The scale training would use (delayed scaling: from an earlier amax).
    scale = (torch.finfo(torch.float8_e4m3fn).max / xs[0].abs().max().float()).reshape(1)

    def kit_delayed(i):
        return ext.quantize(xs[i % copies], scale, "e4m3", True, True, amaxes[i % copies])

    def kit_rowwise(i):
        return ext.quantize(xs[i % copies], scale, "e4m3", True, False, amaxes[i % copies])

    def kit_current(i):
        return ext.quantize_current_scaling(xs[i % copies], "e4m3", True, True)

    def eager(i):
        return _torch_amax_cast_transpose(xs[i % copies])

    case = f"{rows_}x{cols}"
    target = "P2" if ctx.quick or (rows_, cols) in TARGET_SHAPES else None

    def row(group, anchor, kit_bytes, anchor_bytes, tgt=None):
        return Row(SECTION, group, case, n, "TB/s", anchor, fp8kit_work=kit_bytes * n,
                   anchor_work=anchor_bytes * n, target=tgt)

    r_del = row(G_DELAYED, "copy-speed limit (4 B/el)", 4, 4, target)
    r_row = row(G_ROWWISE, "copy-speed limit (3 B/el)", 3, 3)
    r_cur = row(G_CURRENT, "two-pass limit (copy x 4/6)", 4, 4, target)
    r_eag = row(G_EAGER, "torch eager", 4, 4)
    out = [r_del, r_row, r_cur, r_eag]

    # Checks, bit for bit against PyTorch's own cast.
    x0 = xs[0]
    want_amax = x0.abs().max().float()
    fns = {"copy": copy}
    try:
        data, columnwise, scale_inv = kit_delayed(0)
        ref = cast_e4m3(x0, scale)
        checks.same_fp8("delayed rowwise", data, ref)
        checks.same_fp8("delayed columnwise", columnwise, ref.t().contiguous())
        if amaxes[0].item() != want_amax.item():
            raise checks.Mismatch(f"amax {amaxes[0].item()} != {want_amax.item()}")
        _exact("delayed scale_inv", scale_inv, 1.0 / scale.cpu().reshape(()))
        r_del.check = "bit-exact data, transpose, amax, scale_inv"
        fns["delayed"] = kit_delayed
    except checks.Mismatch as e:
        r_del.error = f"not timed: {e}"
    try:
        data, columnwise, _ = kit_rowwise(0)
        if columnwise is not None:
            raise checks.Mismatch("rowwise-only call returned columnwise data")
        checks.same_fp8("rowwise", data, cast_e4m3(x0, scale))
        r_row.check = "bit-exact data"
        fns["rowwise"] = kit_rowwise
    except checks.Mismatch as e:
        r_row.error = f"not timed: {e}"
    try:
        data, columnwise, c_scale, c_scale_inv, c_amax = kit_current(0)
        if c_amax.float().reshape(()).item() != want_amax.item():
            raise checks.Mismatch(f"amax {c_amax.item()} != {want_amax.item()}")
        want_scale = torch.tensor(torch.finfo(torch.float8_e4m3fn).max) / want_amax.cpu()
        _exact("current scale", c_scale, want_scale)
        _exact("current scale_inv", c_scale_inv, 1.0 / want_scale)
        ref = cast_e4m3(x0, c_scale.float().reshape(1))
        checks.same_fp8("current rowwise", data, ref)
        checks.same_fp8("current columnwise", columnwise, ref.t().contiguous())
        r_cur.check = "bit-exact data, transpose, amax, scale, scale_inv"
        fns["current"] = kit_current
        q, _, _, _ = eager(0)
        try:
            r_eag.check = "vs fp8kit: " + checks.close_fp8("torch eager vs fp8kit", q, data)
            fns["eager"] = eager
        except checks.Mismatch as e:
            r_eag.error = f"not timed: {e}"
    except checks.Mismatch as e:
        r_cur.error = r_eag.error = f"not timed: {e}"

    out += _block_rows(x0, xs, copies, fns, row)

    r_cmp = r_cmpd = None
    if ctx.torch_compile and not ctx.quick:
        r_cmp = row(G_COMPILE, "torch.compile", 4, 4)
        r_cmpd = row(G_COMPILE_DELAYED, "torch.compile", 4, 4)
        out += [r_cmp, r_cmpd]
        try:
            compiled = torch.compile(_torch_amax_cast_transpose, dynamic=False)
            q, _, _, _ = compiled(x0)
            r_cmp.check = "vs fp8kit: " + checks.close_fp8("torch.compile vs fp8kit", q,
                                                           kit_current(0)[0])
            fns["compile"] = lambda i: compiled(xs[i % copies])
        except Exception as e:  # noqa: BLE001  (compilation can fail; report, go on)
            r_cmp.error = f"torch.compile peer not timed: {type(e).__name__}: {e}"[:300]
        try:
            compiled_d = torch.compile(_torch_delayed_cast_transpose, dynamic=False)
            q, _, _ = compiled_d(x0, scale)
            r_cmpd.check = "vs fp8kit: " + checks.close_fp8("torch.compile vs fp8kit", q,
                                                            kit_delayed(0)[0])
            fns["compile_delayed"] = lambda i: compiled_d(xs[i % copies], scale)
        except Exception as e:  # noqa: BLE001  (compilation can fail; report, go on)
            r_cmpd.error = f"torch.compile peer not timed: {type(e).__name__}: {e}"[:300]

    t = timing.measure(fns, timing.torch_clock(dev), ctx.settings)
    t_copy = t["copy"].median_s
    copy_note = f"copy {4 * n / t_copy / 1e12:.3g} TB/s (4 B/el), {copies} input copies"
    blocks = [(r, r.case.split()[0], t_copy) for r in out if r.group == G_BLOCK]
    for r, key, anchor_s in ((r_del, "delayed", t_copy), (r_row, "rowwise", t_copy * 3 / 4),
                             (r_cur, "current", t_copy * 6 / 4), *blocks):
        r.note = copy_note
        if key in t:
            r.fp8kit_s, r.anchor_s = t[key].median_s, anchor_s
            r.timing = {"fp8kit": t[key].to_json(), "copy": t["copy"].to_json()}
    for r, kit, key in ((r_eag, "current", "eager"), (r_cmp, "current", "compile"),
                        (r_cmpd, "delayed", "compile_delayed")):
        if r is not None and key in t and kit in t:
            r.fp8kit_s, r.anchor_s = t[kit].median_s, t[key].median_s
            r.timing = {"fp8kit": t[kit].to_json(), "anchor": t[key].to_json()}
        elif r is not None and not r.error:
            r.error = f"not timed: fp8kit's {kit} scaling failed its check"
    del xs, copy
    if dev == "cuda":
        torch.cuda.empty_cache()
    return out


def _block_rows(x0, xs, copies, fns, row) -> list[Row]:
    """One row per block scaling mode; its function joins fns once its two
    copies dequantize to x within E4M3's rounding (quantize_block's bits
    against the float64 model are the unit tests' job)."""
    import torch
    import fp8kit.torch as ft
    rows = []
    for mode in BLOCK_MODES:
        r = row(G_BLOCK, "copy-speed limit (4 B/el)", 4, 4, "P6-quantize")
        r.case = f"{mode} {r.case}"
        rows.append(r)

        def fn(i, mode=mode):
            return ft.quantize_block(xs[i % copies], "e4m3", mode, True, True)
        try:
            data, sinv, cw, cw_sinv = fn(0)
            errs = [checks.norm_rel_err(ft.dequantize_block(d, s, mode, torch.float32, from_cw),
                                        x0.float())
                    for d, s, from_cw in ((data, sinv, False), (cw, cw_sinv, True))]
            for what, err in zip(("rowwise", "columnwise"), errs):
                checks.within(f"{mode} {what}", err, BLOCK_TOL, "rel err")
            r.check = (f"dequantized vs x: rowwise rel err {errs[0]:.2g}, columnwise "
                       f"{errs[1]:.2g} <= {BLOCK_TOL:g}")
            fns[mode] = fn
        except checks.Mismatch as e:
            r.error = f"not timed: {e}"
    return rows


def cases(ctx: Context) -> list[Case]:
    return shape_cases(ctx, SECTION, G_DELAYED, "quantize", run_shape, SHAPES, QUICK_SHAPES)
