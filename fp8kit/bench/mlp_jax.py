"""MLP block section, JAX (part of "fused"): the Llama-3-8B MLP block,
RMSNorm -> fc1 -> SwiGLU (or GELU) -> fc2, 8192 tokens, hidden 4096, ffn
14336, and the SwiGLU block at hidden 8192, ffn 28672 (Llama-3-70B's
widths), forward and backward (jax.vjp with a random
cotangent, so every GEMM stays alive) under jax.jit, each row against the
same block in bf16 (plain jnp) on the same inputs:

  unfused  jnp RMSNorm + fp8kit.jax.dense + jnp activation + fp8kit.jax.dense
           (each dense casts its input in a pass of its own);
  fused    fp8kit.jax.layernorm_mlp (the norm and the activation write the
           next GEMM's FP8 input themselves);
  TE       TransformerEngine-JAX's flax LayerNormMLP with the same weights,
           when it is installed (a peer; te_peer.py);
each with delayed scaling (a state after one training step: the scales
training would have) and current scaling. The ratio is bf16 time / fp8kit
time. With TE present, a second group gives fp8kit's fused block against
TE's directly (target P7 for the Llama-3-8B SwiGLU block; the hidden-8192
rows are for information). The quick mode runs tiny shapes (the CPU smoke
run).
"""

from __future__ import annotations

import functools

from fp8kit.bench import checks, te_peer, timing
from fp8kit.bench.context import Case, Context
from fp8kit.bench.results import Row

SECTION = "fused"
# (tokens, hidden, ffn) of the Llama-3-8B MLP block (P7's), and at hidden
# 8192 (Llama-3-70B's widths, SwiGLU only); quick: a tiny one.
SHAPE = (8192, 4096, 14336)
WIDE_SHAPE = (8192, 8192, 28672)
QUICK_SHAPE = (64, 64, 128)
ACTIVATIONS = ("swiglu", "gelu")
FWD_TOL, BWD_TOL = 0.1, 0.2   # two FP8 GEMMs in series (and SwiGLU's product)
G_MLP = "JAX jit: MLP block fwd+bwd (RMSNorm), fp8kit vs bf16"
G_TE = "JAX jit: MLP block fwd+bwd (RMSNorm), fp8kit fused vs TransformerEngine"
EPS = 1e-5


def _rms_norm(x, gamma):
    """RMSNorm in float32, rounded to x's dtype."""
    import jax
    import jax.numpy as jnp
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt((x32 * x32).mean(-1, keepdims=True) + EPS)
            * gamma.astype(jnp.float32)).astype(x.dtype)


def _activation(h, act: str):
    """SwiGLU on [gate | up], or GELU (tanh approximation)."""
    import jax
    import jax.numpy as jnp
    if act == "swiglu":
        gate, up = jnp.split(h, 2, axis=-1)
        return jax.nn.silu(gate) * up
    return jax.nn.gelu(h, approximate=True)


def _bf16_block(act: str):
    """The block in plain jnp with bf16 GEMMs."""
    def block(x, gamma, k1, k2, st):
        return _activation(_rms_norm(x, gamma) @ k1, act) @ k2
    return block


def _unfused_block(act: str, recipe):
    """The jnp norm and activation around two fp8kit.jax.dense calls (a
    delayed state per dense)."""
    import fp8kit.jax as fj

    def block(x, gamma, k1, k2, st):
        s1, s2 = (None, None) if st is None else st
        h = fj.dense(_rms_norm(x, gamma), k1, state=s1, recipe=recipe)
        return fj.dense(_activation(h, act), k2, state=s2, recipe=recipe)
    return block


def _fused_block(act: str, recipe):
    import fp8kit.jax as fj

    def block(x, gamma, k1, k2, st):
        return fj.layernorm_mlp(x, gamma, None, k1, k2, normalization="rmsnorm",
                                activation=act, epsilon=EPS, state=st, recipe=recipe)
    return block


def _fresh_state(kind: str, recipe):
    import fp8kit.jax as fj
    from fp8kit.recipe import DelayedScaling
    if not isinstance(recipe, DelayedScaling):
        return None
    if kind == "fused":
        return fj.DelayedScalingState.create(recipe, num_linears=2)
    return (fj.DelayedScalingState.create(recipe), fj.DelayedScalingState.create(recipe))


def run_mlp(ctx: Context, act: str, shape: tuple) -> list[Row]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from fp8kit.recipe import CurrentScaling, DelayedScaling

    m, hidden, ffn = shape
    n1 = 2 * ffn if act == "swiglu" else ffn
    dev = jax.devices()[0]
    kx, k1k, k2k, kg, kd = jax.random.split(jax.random.PRNGKey(7), 5)
    put = lambda a: jax.device_put(a.astype(jnp.bfloat16), dev)  # noqa: E731
    x = put(jax.random.normal(kx, (m, hidden), jnp.float32))
    gamma = put(1 + 0.1 * jax.random.normal(kg, (hidden,), jnp.float32))
    k1 = put(jax.random.normal(k1k, (hidden, n1), jnp.float32) / np.sqrt(hidden))
    k2 = put(jax.random.normal(k2k, (ffn, hidden), jnp.float32) / np.sqrt(ffn))
    dy = put(jax.random.normal(kd, (m, hidden), jnp.float32))

    def fwd_bwd(f):
        def run(x, gamma, k1, k2, st, dy):
            y, vjp = jax.vjp(f, x, gamma, k1, k2, st)
            return y, vjp(dy)
        return jax.jit(run)

    base = fwd_bwd(_bf16_block(act))
    want_y, want_g = base(x, gamma, k1, k2, None, dy)
    gemm_flops = 2.0 * m * hidden * n1 + 2.0 * m * ffn * hidden
    fns = {"bf16": lambda i: base(x, gamma, k1, k2, None, dy)}
    rows = {}
    for kind, make in (("unfused", _unfused_block), ("fused", _fused_block)):
        for rname, recipe in (("delayed", DelayedScaling()), ("current", CurrentScaling())):
            name = f"{kind} {rname}"
            f = fwd_bwd(make(act, recipe))
            row = Row(SECTION, G_MLP, f"{act} {m}x{hidden}x{ffn} {name}", gemm_flops, "TFLOP/s",
                      "bf16 jnp (jax.vjp)", fp8kit_work=3 * gemm_flops,
                      anchor_work=3 * gemm_flops,
                      note="fused: fp8kit.jax.layernorm_mlp; unfused: jnp norm and activation "
                           "around two fp8kit.jax.dense")
            rows[name] = row
            try:
                st = _fresh_state(kind, recipe)
                if st is not None:  # the state after one training step
                    st = f(x, gamma, k1, k2, st, dy)[1][4]
                y, g = f(x, gamma, k1, k2, st, dy)
                row.check = _check(y, g[0], g[2], want_y, want_g)
                fns[name] = functools.partial(
                    lambda i, g, st: g(x, gamma, k1, k2, st, dy), g=f, st=st)
            except checks.Mismatch as e:
                row.error = f"not timed: {e}"
    te_missing = _add_te(act, (m, hidden, ffn), (x, gamma, k1, k2, dy), (want_y, want_g),
                         gemm_flops, fns, rows)
    t = timing.measure(fns, timing.jax_clock(), ctx.settings)
    for name, row in rows.items():
        if name in t:
            row.fp8kit_s, row.anchor_s = t[name].median_s, t["bf16"].median_s
            row.timing = {"fp8kit": t[name].to_json(), "anchor": t["bf16"].to_json()}
    out = list(rows.values())
    if te_missing:
        out[0].note += f"; {te_missing}"
    return out + _te_rows(act, (m, hidden, ffn), gemm_flops, t, rows)


def _check(y, dx, dk1, want_y, want_g) -> str:
    e_y = checks.norm_rel_err(y, want_y)
    e_dx = checks.norm_rel_err(dx, want_g[0])
    e_dk1 = checks.norm_rel_err(dk1, want_g[2])
    checks.within("MLP y", e_y, FWD_TOL, "rel err")
    checks.within("MLP dx", e_dx, BWD_TOL, "rel err")
    checks.within("MLP dkernel_1", e_dk1, BWD_TOL, "rel err")
    return f"rel err y {e_y:.2g}<={FWD_TOL:g}, dx {e_dx:.2g} dk1 {e_dk1:.2g}<={BWD_TOL:g}"


def _add_te(act, shape, inputs, want, gemm_flops, fns, rows) -> str:
    """Adds the TE-JAX variants ('TE delayed', 'TE current') to fns and rows
    (checked like fp8kit's: y, dx and the first kernel's gradient); returns
    a note when TE is missing."""
    import jax
    tej, missing = te_peer.jax_module()
    if tej is None:
        return missing
    x, gamma, k1, k2, dy = inputs
    m, hidden, ffn = shape
    for rname in ("delayed", "current"):
        name = f"TE {rname}"
        row = Row(SECTION, G_MLP, f"{act} {m}x{hidden}x{ffn} {name}", gemm_flops, "TFLOP/s",
                  "bf16 jnp (jax.vjp)", fp8kit_work=3 * gemm_flops, anchor_work=3 * gemm_flops,
                  note="TransformerEngine-JAX flax LayerNormMLP (its time in the fp8kit column)")
        rows[name] = row
        try:
            block, variables = te_peer.jax_mlp(tej, rname, act, x, gamma, k1, k2, EPS)

            def run(x, variables, dy, block=block):
                y, vjp = jax.vjp(block, x, variables)
                return y, vjp(dy)
            f = jax.jit(run)
            y, (dx, dvars) = f(x, variables, dy)
            dk1 = dvars["params"]["wi_kernel"].reshape(k1.shape)
            row.check = _check(y, dx, dk1, *want)
            fns[name] = functools.partial(lambda i, f, v: f(x, v, dy), f=f, v=variables)
        except Exception as e:  # noqa: BLE001  (a failing peer must not cost fp8kit's rows)
            row.error = f"not timed: {type(e).__name__}: {str(e)[:300]}"
    return ""


def _te_rows(act, shape, gemm_flops, t, rows) -> list[Row]:
    """fp8kit's fused block vs TE's, per recipe (P7 for SwiGLU)."""
    m, hidden, ffn = shape
    out = []
    for rname in ("delayed", "current"):
        kit, peer = rows.get(f"fused {rname}"), rows.get(f"TE {rname}")
        if peer is None:
            continue
        row = Row(SECTION, G_TE, f"{act} {m}x{hidden}x{ffn} {rname}", gemm_flops, "TFLOP/s",
                  f"TransformerEngine-JAX {rname}", fp8kit_work=3 * gemm_flops,
                  anchor_work=3 * gemm_flops,
                  target="P7" if act == "swiglu" and shape in (SHAPE, QUICK_SHAPE) else None,
                  check=f"fp8kit {kit.check or '-'}; TE {peer.check or '-'}",
                  error=kit.error or peer.error)
        if f"fused {rname}" in t and f"TE {rname}" in t:
            a, b = t[f"fused {rname}"], t[f"TE {rname}"]
            row.fp8kit_s, row.anchor_s = a.median_s, b.median_s
            row.timing = {"fp8kit": a.to_json(), "anchor": b.to_json()}
        out.append(row)
    return out


def cases(ctx: Context) -> list[Case]:
    import jax  # noqa: F401  (ImportError here: the suite reports JAX as not run)
    import fp8kit.jax  # noqa: F401
    if ctx.quick:
        runs = [(act, QUICK_SHAPE) for act in ACTIVATIONS]
    else:
        runs = [(act, SHAPE) for act in ACTIVATIONS] + [("swiglu", WIDE_SHAPE)]
    return [Case(SECTION, G_MLP, f"JAX MLP block {act} {'x'.join(map(str, shape))}",
                 functools.partial(run_mlp, ctx, act, shape)) for act, shape in runs]
