"""Grouped section, PyTorch: the expert layer of a mixture of experts,
fp8kit.torch.GroupedLinear fwd+bwd (x [tokens, hidden] sorted by expert,
one GEMM group per expert, bf16 in and out, random dy), eager:

    bf16     GroupedLinear outside autocast: torch._grouped_mm on CUDA
             (PyTorch's own grouped bf16 GEMM; the anchor, target P11)
    fp8kit   GroupedLinear under current, delayed and block scaling (one
             scale per expert and operand; per 1x128 tile and 128x128
             block)
    TE       TransformerEngine's GroupedLinear with the same weights under
             its recipe of the same name, when it is installed (target P11)

at Mixtral-like (8 experts, hidden 4096, expert ffn 14336, 16384 routed
tokens: top-2 of 8192) and DeepSeek-like shapes (64 experts, hidden 7168,
expert ffn 2048, 65536 routed tokens), each with balanced counts and with
skewed ones (expert e gets a share proportional to 1 / (e + 1), rounded
down to a multiple of 16, the rest to expert 0; one expert gets none).
Every count is a multiple of 16 because TE's FP8 grouped GEMM needs it
(its GroupedLinear refuses other counts: "Caller must pad", and its users
pad each expert's tokens to 16); fp8kit takes any counts, which its own
tests cover. The counts are given on the host, as TE takes them, so no
variant pays a device-to-host read. Each variant is checked against bf16
before it is timed, all in one measure() (interleaved rounds). TE is a
peer: a TE variant that fails, at its check or while it is timed, is
dropped and its rows say why in their note; fp8kit's and bf16's rows
stand.
DeepGEMM's published grouped FP8 figures (H800, contiguous layout, 1x128
/ 128x128 scaling: 1088-1297 TFLOP/s) are quoted in docs/benchmarks.md
beside these rows; they are not measured here.
"""

from __future__ import annotations

import contextlib
import copy
import functools

from fp8kit.bench import checks, te_peer, timing
from fp8kit.bench.context import Case, Context
from fp8kit.bench.results import Row

SECTION = "grouped"
# (experts, routed tokens, hidden, expert ffn)
SHAPES = [(8, 16384, 4096, 14336), (64, 65536, 7168, 2048)]
QUICK_SHAPES = [(4, 128, 64, 96)]
# TE's FP8 grouped GEMM takes only counts that are multiples of this.
COUNT_MULTIPLE = 16
FWD_TOL = 0.1    # ||fp8 - bf16|| / ||bf16|| of the output (one E4M3 GEMM)
BWD_TOL = 0.2    # of dx (E5M2 gradient, one GEMM)
GROUP = "PyTorch GroupedLinear fwd+bwd ({} scaling), fp8kit vs {}"


def counts(experts: int, tokens: int, skewed: bool) -> list[int]:
    """Tokens per expert, summing to `tokens`: equal shares, or shares
    falling as 1 / (e + 1) with the last expert given none (an empty group
    every GEMM must skip). Each share is rounded down to a multiple of
    COUNT_MULTIPLE and the rest goes to expert 0, so every count is a
    multiple of it where `tokens` is (TE needs that; the module doc)."""
    if not skewed:
        weights = [1.0] * experts
    else:
        weights = [1.0 / (e + 1) for e in range(experts - 1)] + [0.0]
    m = COUNT_MULTIPLE
    base = [int(tokens * w / sum(weights)) // m * m for w in weights]
    base[0] += tokens - sum(base)
    return base


def _fwd_bwd(layer, data, sizes):
    import torch
    params = [p for p in layer.parameters() if p.requires_grad]

    def step(i):
        x, dy = data[i % len(data)]
        y = layer(x, sizes)
        return (y, *torch.autograd.grad(y, [x, *params], dy))
    return step


def _te_layer(te, kit_layer):
    """te.GroupedLinear with the experts' weights of a GroupedLinear, and
    fn(x, sizes) calling it with the counts as the list TE takes."""
    import torch
    layer = te_peer.torch_grouped_linear(te, kit_layer)

    class _Call(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = layer

        def forward(self, x, sizes):
            return self.inner(x, sizes.tolist())
    return _Call()


def _te_for(dev: str):
    """(transformer_engine.pytorch, None), or (None, why not) (it needs a GPU)."""
    if dev != "cuda":
        return None, "TE needs a GPU"
    return te_peer.torch_module()


def _is_peer(name: str) -> bool:
    return name.startswith("TE ")


def _why(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e)[:300]}"


def _drop(name, why, fns, around, dropped) -> None:
    """Takes the peer variant `name` out of the run, noting why."""
    fns.pop(name, None)
    around.pop(name, None)
    dropped[name] = why


class _PeerFailed(Exception):
    """A peer variant raised while it was timed."""

    def __init__(self, name: str, error: Exception):
        super().__init__(f"{name}: {_why(error)}")
        self.name, self.error = name, error


def _guarded(name, fn):
    """fn, its exceptions raised as _PeerFailed(name)."""
    def call(i):
        try:
            return fn(i)
        except Exception as e:  # noqa: BLE001
            raise _PeerFailed(name, e) from e
    return call


def _guarded_context(name, enter):
    """A context factory like `enter`, whose failures (entering, exiting,
    or inside) are raised as _PeerFailed(name)."""
    @contextlib.contextmanager
    def context():
        try:
            with enter():
                yield
        except _PeerFailed:
            raise
        except Exception as e:  # noqa: BLE001
            raise _PeerFailed(name, e) from e
    return context


def _measure(fns, around, clock, settings, dropped) -> dict:
    """timing.measure of fns, the peer variants guarded: one that raises
    is dropped (noted in `dropped`) and the rest measured again, so a
    peer's failure costs only its own rows."""
    while True:
        guarded = {n: _guarded(n, f) if _is_peer(n) else f for n, f in fns.items()}
        guarded_around = {n: _guarded_context(n, a) if _is_peer(n) else a
                          for n, a in around.items()}
        try:
            return timing.measure(guarded, clock, settings, around=guarded_around)
        except _PeerFailed as e:
            _drop(e.name, f"{e.name} not timed: failed while timed: {_why(e.error)}", fns,
                  around, dropped)


def run_case(ctx: Context, experts: int, tokens: int, hidden: int, ffn: int, skewed: bool,
             seed: int) -> list[Row]:
    import torch
    import fp8kit.torch as ft
    from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling

    dev = ctx.torch_device
    sizes = torch.tensor(counts(experts, tokens, skewed))
    copies = timing.copies_for_l2(2 * tokens * (hidden + ffn))
    g = torch.Generator(device=dev).manual_seed(seed)
    data = [(torch.randn(tokens, hidden, device=dev, dtype=torch.bfloat16,
                         generator=g).requires_grad_(),
             torch.randn(tokens, ffn, device=dev, dtype=torch.bfloat16, generator=g))
            for _ in range(copies)]
    torch.manual_seed(seed)
    layer = ft.GroupedLinear(experts, hidden, ffn, bias=False, device=dev,
                             dtype=torch.bfloat16)
    recipes = {"current": CurrentScaling(), "delayed": DelayedScaling(), "block": BlockScaling()}
    fns = {"bf16": _fwd_bwd(layer, data, sizes)}
    around = {}
    for rname, recipe in recipes.items():
        # Each recipe its own copy of the layer: delayed scaling keeps state.
        fns[rname] = _fwd_bwd(copy.deepcopy(layer), data, sizes)
        around[rname] = functools.partial(ft.autocast, recipe=recipe)
    want = fns["bf16"](0)
    checked, errors, dropped = {}, {}, {}
    te, te_missing = _te_for(dev)
    for rname in recipes if te is not None else ():
        name = f"TE {rname}"
        try:
            # Each call in its own TE autocast, as a training step runs it:
            # TE updates its delayed scales as an autocast exits.
            fns[name] = te_peer.per_call_autocast(_fwd_bwd(_te_layer(te, layer), data, sizes),
                                                  te_peer.torch_autocast(te, rname))
            for _ in range(2):
                fns[name](0)
        except Exception as e:  # noqa: BLE001  (a TE without GroupedLinear, another API)
            _drop(name, f"TransformerEngine's GroupedLinear failed: {_why(e)}", fns, around,
                  dropped)
    for name in [n for n in fns if n != "bf16"]:
        try:
            with around[name]() if name in around else contextlib.nullcontext():
                got = fns[name](0)
            ey = checks.norm_rel_err(got[0], want[0])
            edx = checks.norm_rel_err(got[1], want[1])
            checks.within("output", ey, FWD_TOL, "rel err")
            checks.within("dx", edx, BWD_TOL, "rel err")
            checked[name] = f"rel err y {ey:.2g}<={FWD_TOL:g}, dx {edx:.2g}<={BWD_TOL:g}"
        except Exception as e:  # noqa: BLE001  (a failing peer must not cost fp8kit's rows)
            if _is_peer(name):
                why = str(e) if isinstance(e, checks.Mismatch) else _why(e)
                _drop(name, f"{name} not timed: {why}", fns, around, dropped)
            elif isinstance(e, checks.Mismatch):
                errors[name] = f"not timed: {e}"
                del fns[name]
            else:
                raise
    t = _measure(fns, around, timing.torch_clock(dev), ctx.settings, dropped)
    flops = 3 * 2.0 * tokens * hidden * ffn
    case = f"{experts}x {tokens}x{hidden}x{ffn} {'skewed' if skewed else 'balanced'}"
    rows = []
    for rname in recipes:
        for anchor, label in (("bf16", "bf16 GroupedLinear (torch._grouped_mm on CUDA)"),
                              (f"TE {rname}", "TransformerEngine GroupedLinear")):
            row = Row(SECTION, GROUP.format(rname, label), case, flops, "TFLOP/s", label,
                      fp8kit_work=flops, anchor_work=flops,
                      target="P11-bf16" if anchor == "bf16" else "P11-te",
                      check=checked.get(rname, ""), error=errors.get(rname))
            if anchor != "bf16" and (te_missing or anchor in dropped):
                row.note = te_missing or dropped[anchor]
            if rname in t and anchor in t:
                row.fp8kit_s, row.anchor_s = t[rname].median_s, t[anchor].median_s
                row.timing = {"fp8kit": t[rname].to_json(), "anchor": t[anchor].to_json()}
            rows.append(row)
    del data, layer
    if dev == "cuda":
        torch.cuda.empty_cache()
    return rows


def cases(ctx: Context) -> list[Case]:
    shapes = QUICK_SHAPES if ctx.quick else SHAPES
    return [Case(SECTION, "PyTorch GroupedLinear",
                 f"torch GroupedLinear {e} experts {t}x{h}x{f} "
                 f"{'skewed' if skewed else 'balanced'}",
                 functools.partial(run_case, ctx, e, t, h, f, skewed, seed))
            for seed, ((e, t, h, f), skewed) in enumerate(
                (s, k) for s in shapes for k in (False, True))]
