"""Fused layers section, PyTorch: the Llama-3-8B MLP block (RMSNorm ->
fc1 -> SwiGLU or GELU -> fc2; 8192 tokens, hidden 4096, ffn 14336) and a
LayerNormLinear QKV projection (8192 x 4096 -> 3 x 4096), and both at
hidden 8192 (SwiGLU, ffn 28672; QKV 8192 -> 3 x 8192), fwd+bwd, bf16 in
and out, eager:

    bf16     torch.nn.RMSNorm + torch.nn.Linear + activation in bf16 (anchor)
    unfused  the same with fp8kit.torch.Linear for the projections
    fused    fp8kit.torch.LayerNormMLP / LayerNormLinear (the norm and the
             activation write the GEMMs' FP8 inputs)
    TE       TransformerEngine's LayerNormMLP / LayerNormLinear, when it is
             installed (a peer; te_peer.py)

each FP8 variant under delayed, current and block scaling (TE's
Float8BlockScaling for block; the fused layers also with the forward
GEMM's fast accumulation, TE's own choice for the per-tensor recipes), with the same
weights and inputs, checked against bf16 before it is timed, all in one measure()
(interleaved rounds). With TE present, a second group gives fp8kit's fused
layer against TE's directly (target P7 for the Llama-3-8B SwiGLU MLP; the
rest is for information).

On a GPU, two more groups give each variant's extra peak memory: what one
fwd+bwd call allocates at its peak beyond what was allocated before it
(weights, inputs, the FP8 scaling state), in MiB, against bf16 and against
TE (ratio = the anchor's bytes / fp8kit's: > 1, fp8kit needs less).
"""

from __future__ import annotations

import contextlib
import functools

from fp8kit.bench import checks, te_peer, timing
from fp8kit.bench.context import Case, Context
from fp8kit.bench.results import Row

SECTION = "fused"
MLP_SIZE = (8192, 4096, 14336)       # tokens, hidden, ffn (Llama-3-8B; P7's)
QKV_SIZE = (8192, 4096, 3 * 4096)    # tokens, hidden, out_features
WIDE_MLP_SIZE = (8192, 8192, 28672)  # hidden 8192 (Llama-3-70B's widths)
WIDE_QKV_SIZE = (8192, 8192, 3 * 8192)
QUICK_MLP_SIZE = (45, 64, 96)    # 45 tokens: wgrad pads the token dimension
QUICK_QKV_SIZE = (45, 64, 192)
FWD_TOL = 0.1    # ||fp8 - bf16|| / ||bf16|| of the output (two E4M3 GEMMs)
BWD_TOL = 0.25   # of dx (E5M2 gradients through two GEMMs and the activation)


# TransformerEngine's recipes accumulate the forward GEMM natively (fast);
# fp8kit's default splits it. These fused variants match TE's choice, so the
# TE group shows how much of a gap is that choice alone.
FAST = ", fast fwd acc"


def _recipes():
    from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling
    return {"delayed": DelayedScaling(), "current": CurrentScaling(), "block": BlockScaling(),
            "delayed" + FAST: DelayedScaling(forward_fast_accumulation=True),
            "current" + FAST: CurrentScaling(forward_fast_accumulation=True)}


class _Block:
    """norm -> fc1 -> activation -> fc2 (or norm -> linear when fc2 is None),
    from the given modules: the bf16 anchor and the unfused fp8kit layers."""

    def __init__(self, norm, fc1, fc2=None, activation=None):
        self.norm, self.fc1, self.fc2, self.activation = norm, fc1, fc2, activation

    def parameters(self):
        mods = [m for m in (self.norm, self.fc1, self.fc2) if m is not None]
        return [p for m in mods for p in m.parameters()]

    def __call__(self, x):
        import torch.nn.functional as F
        h = self.fc1(self.norm(x))
        if self.fc2 is None:
            return h
        if self.activation == "gelu":
            a = F.gelu(h, approximate="tanh")
        else:
            gate, up = h.chunk(2, dim=-1)
            a = F.silu(gate) * up
        return self.fc2(a)


def make_layers(kind: str, hidden: int, width: int, device: str, seed: int) -> dict:
    """{'bf16', 'unfused', 'fused'} with equal weights; kind 'gelu' or
    'swiglu' (an MLP with ffn = width) or 'qkv' (out_features = width)."""
    import torch
    import fp8kit.torch as ft
    torch.manual_seed(seed)
    kw = {"device": device, "dtype": torch.bfloat16}
    norm = torch.nn.RMSNorm(hidden, eps=1e-5, **kw)
    if kind == "qkv":
        fc1, fc2 = torch.nn.Linear(hidden, width, **kw), None
    else:
        fc1 = torch.nn.Linear(hidden, 2 * width if kind == "swiglu" else width, **kw)
        fc2 = torch.nn.Linear(width, hidden, **kw)

    def kit(lin):
        out = ft.Linear(lin.in_features, lin.out_features, **kw)
        out.load_state_dict(lin.state_dict(), strict=False)
        return out

    act = None if kind == "qkv" else kind
    unfused = _Block(norm, kit(fc1), kit(fc2) if fc2 is not None else None, act)
    fused = (ft.LayerNormLinear.from_unfused(norm, fc1) if kind == "qkv"
             else ft.LayerNormMLP.from_unfused(norm, fc1, fc2, activation=kind))
    return {"bf16": _Block(norm, fc1, fc2, act), "unfused": unfused, "fused": fused}


def _fwd_bwd(layer, data):
    import torch
    params = [p for p in layer.parameters() if p.requires_grad]

    def step(i):
        x, dy = data[i % len(data)]
        y = layer(x)
        return (y, *torch.autograd.grad(y, [x, *params], dy))
    return step


def _check(got, want) -> str:
    ey, edx = checks.norm_rel_err(got[0], want[0]), checks.norm_rel_err(got[1], want[1])
    checks.within("output", ey, FWD_TOL, "rel err")
    checks.within("dx", edx, BWD_TOL, "rel err")
    return f"rel err y {ey:.2g}<={FWD_TOL:g}, dx {edx:.2g}<={BWD_TOL:g}"


def _add_te(layers, data, want, fns, around, found, errors) -> str:
    """Adds the TE variants ('TE delayed', 'TE current', 'TE block': its
    Float8BlockScaling) to fns; returns a note when TE is missing."""
    te, missing = te_peer.torch_module()
    if te is None:
        return missing
    b = layers["bf16"]
    for rname in ("delayed", "current", "block"):
        name = f"TE {rname}"
        try:
            fn = te_peer.per_call_autocast(
                _fwd_bwd(te_peer.torch_layer(te, b.norm, b.fc1, b.fc2, b.activation), data),
                te_peer.torch_autocast(te, rname))
            for i in range(2):  # delayed: TE updates its scales as each autocast exits
                fn(0)
            found[name] = _check(fn(0), want)
            fns[name] = fn
        except Exception as e:  # noqa: BLE001  (a failing peer must not cost fp8kit's rows)
            errors[name] = f"not timed: {type(e).__name__}: {str(e)[:300]}"
    return ""


def _layer_name(kind: str) -> str:
    return "LayerNormLinear (RMSNorm, QKV)" if kind == "qkv" else f"LayerNormMLP ({kind})"


def _te_rows(kind, case_size, flops, t, found, errors, p7: bool) -> list:
    """fp8kit fused vs TE, per recipe (P7 for the Llama-3-8B SwiGLU MLP: p7)."""
    group = f"PyTorch {_layer_name(kind)} fwd+bwd, fp8kit fused vs TransformerEngine"
    rows = []
    for rname in _recipes():
        te_rname = rname.replace(FAST, "")
        kit, peer = f"fused {rname}", f"TE {te_rname}"
        if peer not in found and peer not in errors:
            continue
        row = Row(SECTION, group, f"{case_size} {rname}", flops, "TFLOP/s",
                  f"TransformerEngine {te_rname}", fp8kit_work=flops, anchor_work=flops,
                  target="P7" if p7 and kind == "swiglu" and FAST not in rname else None,
                  check=f"fp8kit {found.get(kit, '-')}; TE {found.get(peer, '-')}",
                  error=errors.get(kit) or errors.get(peer))
        if kit in t and peer in t:
            row.fp8kit_s, row.anchor_s = t[kit].median_s, t[peer].median_s
            row.timing = {"fp8kit": t[kit].to_json(), "anchor": t[peer].to_json()}
        rows.append(row)
    return rows


def _extra_peak_bytes(fn, enter) -> int:
    """Bytes CUDA's allocator held at the peak of one call of fn (inside
    enter(), a context manager) beyond what it held before the call."""
    import torch
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with enter():
        out = fn(0)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    return peak


def memory_rows(layer: str, case_size: str, peaks: dict) -> list:
    """Extra peak memory rows from {variant: bytes}: every FP8 variant
    against bf16, and fp8kit's fused layer against TE's per recipe."""
    rows = []

    def add(group, anchor_name, kit, peer):
        if kit in peaks and peer in peaks:
            rows.append(Row(SECTION, group, f"{case_size} {kit}", peaks[kit], "MiB",
                            anchor_name, fp8kit_work=peaks[kit], anchor_work=peaks[peer],
                            check="one fwd+bwd call, CUDA allocator peak"))
    for name in sorted(peaks):
        if name != "bf16" and not name.startswith("TE "):
            add(f"PyTorch {layer} fwd+bwd, extra peak memory, fp8kit vs bf16",
                "bf16 torch modules", name, "bf16")
    for rname in ("delayed", "current", "block"):
        add(f"PyTorch {layer} fwd+bwd, extra peak memory, fp8kit fused vs TransformerEngine",
            f"TransformerEngine {rname}", f"fused {rname}", f"TE {rname}")
    return rows


def run_case(ctx: Context, kind: str, tokens: int, hidden: int, width: int, seed: int):
    import torch
    import fp8kit.torch as ft

    dev = ctx.torch_device
    out_features = width if kind == "qkv" else hidden
    copies = timing.copies_for_l2(2 * (tokens * hidden + tokens * out_features))
    g = torch.Generator(device=dev).manual_seed(seed)
    data = [(torch.randn(tokens, hidden, device=dev, dtype=torch.bfloat16,
                         generator=g).requires_grad_(),
             torch.randn(tokens, out_features, device=dev, dtype=torch.bfloat16, generator=g))
            for _ in range(copies)]
    layers = make_layers(kind, hidden, width, dev, seed)
    fns = {"bf16": _fwd_bwd(layers["bf16"], data)}
    want = fns["bf16"](0)
    around, found, errors = {}, {}, {}
    for rname, recipe in _recipes().items():
        for lname in ("unfused", "fused") if FAST not in rname else ("fused",):
            name = f"{lname} {rname}"
            # Each variant its own layers, hence its own FP8 state.
            fn = _fwd_bwd(make_layers(kind, hidden, width, dev, seed)[lname], data)
            try:
                with ft.autocast(recipe=recipe):
                    fn(0)  # the first delayed-scaling call seeds the scales
                    found[name] = _check(fn(0), want)
                fns[name] = fn
                around[name] = functools.partial(ft.autocast, recipe=recipe)
            except checks.Mismatch as e:
                errors[name] = f"not timed: {e}"
    te_missing = (_add_te(layers, data, want, fns, around, found, errors)
                  if dev == "cuda" else "TransformerEngine peer needs a GPU")
    t = timing.measure(fns, timing.torch_clock(dev), ctx.settings, around=around)
    peaks = ({name: _extra_peak_bytes(fn, around.get(name, contextlib.nullcontext))
              for name, fn in fns.items()} if dev == "cuda" else {})
    if kind == "qkv":
        flops = 3 * 2.0 * tokens * hidden * width
        group = "PyTorch LayerNormLinear fwd+bwd (RMSNorm, QKV), fp8kit vs bf16"
    else:
        fc1_out = 2 * width if kind == "swiglu" else width
        flops = 3 * 2.0 * tokens * hidden * (fc1_out + width)
        group = f"PyTorch LayerNormMLP fwd+bwd (RMSNorm, {kind}), fp8kit vs bf16"
    rows = []
    for name in found.keys() | errors.keys():
        row = Row(SECTION, group, f"{tokens}x{hidden}x{width} {name}", flops, "TFLOP/s",
                  "bf16 torch modules", fp8kit_work=flops, anchor_work=flops,
                  check=found.get(name, ""), error=errors.get(name))
        if name in t and "bf16" in t:
            row.fp8kit_s, row.anchor_s = t[name].median_s, t["bf16"].median_s
            row.timing = {"fp8kit": t[name].to_json(), "anchor": t["bf16"].to_json()}
        rows.append(row)
    rows.sort(key=lambda r: r.case)
    if te_missing:
        rows[0].note = te_missing
    p7 = (tokens, hidden, width) in (MLP_SIZE, QUICK_MLP_SIZE)
    rows += _te_rows(kind, f"{tokens}x{hidden}x{width}", flops, t, found, errors, p7)
    rows += memory_rows(_layer_name(kind), f"{tokens}x{hidden}x{width}", peaks)
    del data, layers
    if dev == "cuda":
        torch.cuda.empty_cache()
    return rows


def cases(ctx: Context) -> list[Case]:
    if ctx.quick:
        runs = [("swiglu", QUICK_MLP_SIZE), ("gelu", QUICK_MLP_SIZE), ("qkv", QUICK_QKV_SIZE)]
    else:
        runs = [("swiglu", MLP_SIZE), ("gelu", MLP_SIZE), ("qkv", QKV_SIZE),
                ("swiglu", WIDE_MLP_SIZE), ("qkv", WIDE_QKV_SIZE)]
    return [Case(SECTION, f"PyTorch {_layer_name(kind)}",
                 f"torch {_layer_name(kind)} {'x'.join(map(str, size))}",
                 functools.partial(run_case, ctx, kind, *size, seed))
            for seed, (kind, size) in enumerate(runs)]
