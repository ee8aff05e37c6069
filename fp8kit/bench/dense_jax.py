"""Linear section, JAX (target P5), everything under jax.jit on JAX's
default device, same inputs side by side:

  GEMM         fp8kit.jax.gemm on already-quantized e4m3 operands, bf16 out,
               vs JAX's own GEMM on the same e4m3 arrays, in two layouts:
               [K,N]  lax.dot(a, b) with b [K, N], the plain call (the peer
                      reference number in docs/benchmarks.md is this call);
                      XLA transposes b inside the program (Hopper's FP8 GEMM
                      takes both operands K-major), fp8kit reads the
                      transposed copy its quantizer writes in the same pass
                      as the data. Target P5-gemm (fast accumulation, which
                      XLA's FP8 GEMMs use at default precision).
               TN     lax.dot_general contracting both operands' last axis
                      (b given as [N, K]): XLA then calls the same cuBLASLt
                      FP8 kernel fp8kit does; for information (parity).
  dense fwd    fp8kit.jax.dense, bf16 in and out, quantization included,
               vs x @ w in bf16 (information; rows with the recipe's opt-in
               fast accumulation in the forward GEMM too), and, where
               TransformerEngine-JAX is installed, vs its flax DenseGeneral
               under the same recipe with the same kernel: target P5-fwd,
               delayed and current scaling.
  dense fwd+bwd  the output and both gradients for a random cotangent
               (jax.vjp: every GEMM stays alive, which a sum() loss would not
               guarantee), vs the same in bf16 and in TE-JAX. Target
               P5-fwd+bwd against TE-JAX, both recipes.

Targets apply at 8192^3; other sizes are for information. Without TE-JAX
the P5-fwd and P5-fwd+bwd rows do not exist and the first bf16 row says
why. The
delayed-scaling state is the one after a training step on the same inputs
(the scales training would have); its update (the state cotangent) is part
of fwd+bwd.
"""

from __future__ import annotations

import functools

from fp8kit.bench import checks, te_peer, timing
from fp8kit.bench.context import Case, Context
from fp8kit.bench.results import Row

SECTION = "linear"
TARGET_SIZE = 8192
SIZES = [4096, TARGET_SIZE]
QUICK_SIZES = [64, 128]
GEMM_TOL = 2e-2   # max rel diff vs lax.dot on the same e4m3 data (accumulation order only)
FWD_TOL, BWD_TOL = 0.08, 0.15
G_GEMM = "JAX jit: fp8kit.jax.gemm on e4m3 vs lax.dot_general on e4m3"
G_GEMM_NN = "JAX jit: fp8kit.jax.gemm vs lax.dot, e4m3 [M,K] x [K,N]"
G_FWD = "JAX jit: dense fwd, fp8kit vs bf16"
G_FWD_BWD = "JAX jit: dense fwd+bwd (random cotangent), fp8kit vs bf16"
G_TE_FWD = "JAX jit: dense fwd, fp8kit vs TransformerEngine-JAX DenseGeneral, same recipe"
G_TE_FWD_BWD = ("JAX jit: dense fwd+bwd (random cotangent), fp8kit vs TransformerEngine-JAX "
                "DenseGeneral, same recipe")
TE_RECIPES = ("delayed", "current")


def _device():
    import jax
    return jax.devices()[0]


def run_gemm(ctx: Context, s: int) -> list[Row]:
    import jax
    import jax.numpy as jnp
    import fp8kit.jax as fj

    dev = _device()
    one = jax.device_put(jnp.ones((), jnp.float32), dev)
    # (a, b, A, B, B_kn): e4m3 arrays, the same data as ScaledTensors, and b
    # read as a [K, N] operand with its transposed copy (which fp8kit's
    # quantizer writes in the same pass as the data).
    sets = []
    key = jax.random.PRNGKey(s)
    transpose = jax.jit(lambda b: b.T)
    for _ in range(timing.copies_for_l2(3 * s * s + 2 * s * s)):  # e4m3 A, B, B^T; bf16 D
        key, ka, kb = jax.random.split(key, 3)
        a, b = (jax.device_put(jax.random.normal(kk, (s, s), jnp.float32)
                               .astype(jnp.float8_e4m3fn), dev) for kk in (ka, kb))
        sets.append((a, b, fj.ScaledTensor(data=a, scale_inv=one, fp8_dtype="e4m3"),
                     fj.ScaledTensor(data=b, scale_inv=one, fp8_dtype="e4m3"),
                     fj.ScaledTensor(data=b, scale_inv=one, columnwise_data=transpose(b),
                                     fp8_dtype="e4m3")))
    lax_fn = jax.jit(lambda a, b: jax.lax.dot_general(
        a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.bfloat16))
    want = lax_fn(sets[0][0], sets[0][1])
    flops = 2.0 * s ** 3
    is_target = ctx.quick or s == TARGET_SIZE
    fns = {"lax": lambda i: lax_fn(*sets[i % len(sets)][:2])}
    rows = {}
    for mode, split in (("fast", False), ("split", True)):
        kit = jax.jit(functools.partial(
            lambda A, B, split: fj.gemm(A, B, trans_b=True, out_dtype=jnp.bfloat16,
                                        use_split_accumulator=split, device=dev), split=split))
        row = Row(SECTION, G_GEMM, f"{s}^3 {mode} acc", s ** 3, "TFLOP/s",
                  "lax.dot_general e4m3", fp8kit_work=flops, anchor_work=flops,
                  note=f"{len(sets)} operand copies")
        rows[mode] = row
        try:
            got = kit(*sets[0][2:4])
            row.check = checks.within("gemm", checks.max_rel_diff(got, want), GEMM_TOL,
                                      "max rel diff")
            fns[mode] = functools.partial(lambda i, f: f(*sets[i % len(sets)][2:4]), f=kit)
        except checks.Mismatch as e:
            row.error = f"not timed: {e}"
    _add_kn_layout_row(s, dev, sets, fns, rows, target="P5-gemm" if is_target else None)
    t = timing.measure(fns, timing.jax_clock(), ctx.settings)
    for mode, row in rows.items():
        anchor = "lax_kn" if mode == "kn" else "lax"
        if mode in t and anchor in t:
            row.fp8kit_s, row.anchor_s = t[mode].median_s, t[anchor].median_s
            row.timing = {"fp8kit": t[mode].to_json(), "anchor": t[anchor].to_json()}
    return list(rows.values())


def _add_kn_layout_row(s, dev, sets, fns, rows, target) -> None:
    """The P5-gemm row: a plain lax.dot(a, b), b [K, N], the call the peer
    reference number measured (it reproduces in this layout only; the TN
    row reaches the cuBLASLt kernel's speed). XLA's FP8 GEMM takes both
    operands K-major on Hopper, so it transposes b inside the program;
    fp8kit reads b's transposed copy, which its quantizer writes in the
    same pass as the data (ScaledTensor.columnwise_data)."""
    import jax
    import jax.numpy as jnp
    import fp8kit.jax as fj

    lax_kn = jax.jit(lambda a, b: jax.lax.dot(a, b, preferred_element_type=jnp.bfloat16))
    kit = jax.jit(lambda A, B: fj.gemm(A, B, out_dtype=jnp.bfloat16,
                                       use_split_accumulator=False, device=dev))
    row = Row(SECTION, G_GEMM_NN, f"{s}^3 fast acc", s ** 3, "TFLOP/s", "lax.dot e4m3 [K,N] b",
              fp8kit_work=2.0 * s ** 3, anchor_work=2.0 * s ** 3, target=target,
              note="fp8kit reads b's transposed copy (written by its quantizer with b); "
                   "lax.dot transposes b in the program")
    rows["kn"] = row
    a, b, _, _, b_kn = sets[0]
    try:
        row.check = checks.within("gemm [K,N]", checks.max_rel_diff(kit(sets[0][2], b_kn),
                                                                   lax_kn(a, b)),
                                  GEMM_TOL, "max rel diff")
        fns["lax_kn"] = lambda i: lax_kn(*sets[i % len(sets)][:2])
        fns["kn"] = lambda i: kit(sets[i % len(sets)][2], sets[i % len(sets)][4])
    except checks.Mismatch as e:
        row.error = f"not timed: {e}"
    except Exception as e:  # noqa: BLE001  (reported in the row; the other rows still run)
        row.error = f"not run: {type(e).__name__}: {e}"


def _trained_state(fwd_bwd, recipe, x, w, dy):
    """The delayed-scaling state after one training step on (x, w, dy):
    seeded, with the scales the timed steps would have in training. Timing
    a fresh state instead would time its seeding on every call."""
    import fp8kit.jax as fj
    _, (_, _, state) = fwd_bwd(x, w, fj.DelayedScalingState.create(recipe), dy)
    return state


def run_dense(ctx: Context, s: int) -> list[Row]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import fp8kit.jax as fj
    from fp8kit.recipe import CurrentScaling, DelayedScaling

    dev = _device()
    kx, kw, kg = jax.random.split(jax.random.PRNGKey(s + 1), 3)
    w = jax.device_put((jax.random.normal(kw, (s, s), jnp.float32) / np.sqrt(s))
                       .astype(jnp.bfloat16), dev)
    # (x, dy) copies, rotated per call: x, dy, y, dx, dw are 10 B per element.
    xs, dys = [], []
    for _ in range(timing.copies_for_l2(10 * s * s)):
        kx, k1, k2 = jax.random.split(kx, 3)
        xs.append(jax.device_put(jax.random.normal(k1, (s, s), jnp.bfloat16), dev))
        dys.append(jax.device_put(jax.random.normal(k2, (s, s), jnp.bfloat16), dev))
    x, dy = xs[0], dys[0]
    n = len(xs)

    def fwd_bwd(f):
        def run(x, w, st, dy):
            y, vjp = jax.vjp(f, x, w, st)
            return y, vjp(dy)  # output, dx, dw (and the new delayed state)
        return jax.jit(run)

    def bf16(x, w, st):
        return x @ w

    base_fwd, base_fb = jax.jit(bf16), fwd_bwd(bf16)
    want_y = base_fwd(x, w, None)
    want_fb = base_fb(x, w, None, dy)
    flops = 2.0 * s ** 3
    is_target = ctx.quick or s == TARGET_SIZE
    fns_fwd = {"bf16": lambda i: base_fwd(xs[i % n], w, None)}
    fns_fb = {"bf16": lambda i: base_fb(xs[i % n], w, None, dys[i % n])}
    rows_fwd, rows_fb = {}, {}
    recipes = (("delayed", DelayedScaling()), ("current", CurrentScaling()),
               ("delayed, fast fwd acc", DelayedScaling(forward_fast_accumulation=True)))
    for name, recipe in recipes:
        f = functools.partial(lambda x, w, st, r: fj.dense(x, w, state=st, recipe=r), r=recipe)
        f_fwd, f_fb = jax.jit(f), fwd_bwd(f)
        st = _trained_state(f_fb, recipe, x, w, dy) if isinstance(recipe, DelayedScaling) \
            else None
        r1 = Row(SECTION, G_FWD, f"{s}^3 {name}", s ** 3, "TFLOP/s", "bf16 x @ w",
                 fp8kit_work=flops, anchor_work=flops)
        r2 = Row(SECTION, G_FWD_BWD, f"{s}^3 {name}", s ** 3, "TFLOP/s", "bf16 (jax.vjp)",
                 fp8kit_work=3 * flops, anchor_work=3 * flops)
        rows_fwd[name], rows_fb[name] = r1, r2
        try:
            r1.check = checks.within("dense fwd", checks.norm_rel_err(f_fwd(x, w, st), want_y),
                                     FWD_TOL, "rel err")
            fns_fwd[name] = functools.partial(lambda i, g, st: g(xs[i % n], w, st), g=f_fwd,
                                              st=st)
        except checks.Mismatch as e:
            r1.error = f"not timed: {e}"
        try:
            y, grads = f_fb(x, w, st, dy)
            e_y = checks.norm_rel_err(y, want_fb[0])
            e_dx = checks.norm_rel_err(grads[0], want_fb[1][0])
            e_dw = checks.norm_rel_err(grads[1], want_fb[1][1])
            checks.within("dense fwd+bwd y", e_y, FWD_TOL, "rel err")
            checks.within("dense dx", e_dx, BWD_TOL, "rel err")
            checks.within("dense dw", e_dw, BWD_TOL, "rel err")
            r2.check = (f"rel err y {e_y:.2g}<={FWD_TOL:g}, dx {e_dx:.2g} dw {e_dw:.2g}"
                        f"<={BWD_TOL:g}")
            fns_fb[name] = functools.partial(lambda i, g, st: g(xs[i % n], w, st, dys[i % n]),
                                             g=f_fb, st=st)
        except checks.Mismatch as e:
            r2.error = f"not timed: {e}"
    te_rows = {}
    if is_target:
        te_missing = _add_te(s, xs, dys, w, (want_y, want_fb), flops, fns_fwd, fns_fb,
                             rows_fwd, rows_fb, te_rows)
        if te_missing:
            rows_fwd["delayed"].note = f"no TE-JAX rows: {te_missing}"
    clock = timing.jax_clock()
    rows_sustained = {}
    if is_target and "delayed" in fns_fb:
        # bf16 and delayed again in 1.5 s batches, each in its own steady state.
        rows_sustained["delayed"] = Row(
            SECTION, G_FWD_BWD, f"{s}^3 delayed, sustained", s ** 3, "TFLOP/s",
            "bf16 (jax.vjp)", fp8kit_work=3 * flops, anchor_work=3 * flops,
            check=rows_fb["delayed"].check)
    fns_sustained = {name: fns_fb[name] for name in ("bf16", *rows_sustained)}
    for fns, rows, sustained, kind in ((fns_fwd, rows_fwd, False, "fwd"),
                                       (fns_fb, rows_fb, False, "fwd+bwd"),
                                       (fns_sustained, rows_sustained, True, "sustained")):
        if not rows:
            continue
        t = (timing.measure_sustained(fns, clock, ctx.quick) if sustained
             else timing.measure(fns, clock, ctx.settings))
        for name, row in rows.items():
            if name in t:
                row.fp8kit_s, row.anchor_s = t[name].median_s, t["bf16"].median_s
                row.timing = {"fp8kit": t[name].to_json(), "anchor": t["bf16"].to_json()}
                if sustained:
                    row.note = timing.gpu_note(t[name], t["bf16"])
        for (te_kind, name), row in te_rows.items():
            if te_kind == kind and name in t and f"TE {name}" in t:
                a, b = t[name], t[f"TE {name}"]
                row.fp8kit_s, row.anchor_s = a.median_s, b.median_s
                row.timing = {"fp8kit": a.to_json(), "anchor": b.to_json()}
    return (list(rows_fwd.values()) + list(rows_fb.values()) + list(rows_sustained.values())
            + list(te_rows.values()))


def _add_te(s, xs, dys, w, want, flops, fns_fwd, fns_fb, rows_fwd, rows_fb, te_rows):
    """TE-JAX's DenseGeneral per recipe ("TE delayed", "TE current") into
    the fwd and fwd+bwd functions, checked as fp8kit's are, and the rows
    comparing the two (P5-fwd, P5-fwd+bwd) into te_rows, keyed by ("fwd" or
    "fwd+bwd", recipe); returns why TE-JAX is missing, or None."""
    import jax
    tej, missing = te_peer.jax_module()
    if tej is None:
        return missing
    want_y, want_fb = want
    x, dy, n = xs[0], dys[0], len(xs)
    for rname in TE_RECIPES:
        name = f"TE {rname}"
        r1 = Row(SECTION, G_TE_FWD, f"{s}^3 {rname}", s ** 3, "TFLOP/s",
                 f"TransformerEngine-JAX {rname}", fp8kit_work=flops, anchor_work=flops,
                 target="P5-fwd")
        r2 = Row(SECTION, G_TE_FWD_BWD, f"{s}^3 {rname}", s ** 3, "TFLOP/s",
                 f"TransformerEngine-JAX {rname}", fp8kit_work=3 * flops,
                 anchor_work=3 * flops, target="P5-fwd+bwd")
        te_rows[("fwd", rname)], te_rows[("fwd+bwd", rname)] = r1, r2
        try:
            layer, variables = te_peer.jax_dense(tej, rname, x, w)

            def run(x, w, dy, layer=layer, variables=variables):
                # The scaling collections too, as fp8kit's state: their
                # gradient is TE's next state, so its update is not dropped.
                y, vjp = jax.vjp(layer, x, w, variables)
                return y, vjp(dy)
            f_fwd = jax.jit(functools.partial(layer, variables=variables))
            f_fb = jax.jit(run)
            e_y = checks.norm_rel_err(f_fwd(x, w), want_y)
            checks.within("TE-JAX dense fwd", e_y, FWD_TOL, "rel err")
            y, (dx, dw, _) = f_fb(x, w, dy)
            errs = [checks.norm_rel_err(g, wg) for g, wg in
                    ((y, want_fb[0]), (dx, want_fb[1][0]), (dw, want_fb[1][1]))]
            for what, err, tol in zip(("y", "dx", "dw"), errs, (FWD_TOL, BWD_TOL, BWD_TOL)):
                checks.within(f"TE-JAX dense {what}", err, tol, "rel err")
        except Exception as e:  # noqa: BLE001  (a failing peer must not cost fp8kit's rows)
            r1.error = r2.error = f"TE not timed: {type(e).__name__}: {str(e)[:300]}"
            continue
        r1.check = f"fp8kit {rows_fwd[rname].check or '-'}; TE rel err {e_y:.2g}"
        r2.check = (f"fp8kit {rows_fb[rname].check or '-'}; TE rel err y {errs[0]:.2g}, dx "
                    f"{errs[1]:.2g} dw {errs[2]:.2g}")
        fns_fwd[name] = functools.partial(lambda i, g: g(xs[i % n], w), g=f_fwd)
        fns_fb[name] = functools.partial(lambda i, g: g(xs[i % n], w, dys[i % n]), g=f_fb)
    return None


def cases(ctx: Context) -> list[Case]:
    import jax  # noqa: F401  (ImportError here: the suite reports JAX as not run)
    import fp8kit.jax  # noqa: F401
    sizes = QUICK_SIZES if ctx.quick else SIZES
    out = []
    for s in sizes:
        out.append(Case(SECTION, G_GEMM, f"JAX gemm {s}^3", functools.partial(run_gemm, ctx, s)))
        out.append(Case(SECTION, G_FWD, f"JAX dense {s}^3", functools.partial(run_dense, ctx, s)))
    return out
