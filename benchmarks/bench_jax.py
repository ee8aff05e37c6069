"""fp8kit's JAX front end vs JAX's own ops, in one run (ANCHORS.md target P5).

Rows (all under jax.jit, same inputs side by side):
  gemm          fp8kit.jax.gemm on pre-quantized e4m3 operands, D = A @ B^T
                (the TN layout, bf16 out)      vs  jax.lax.dot_general on the
                same e4m3 arrays with preferred_element_type=bf16.
  dense fwd     fp8kit.jax.dense (bf16 in and out, quantization included),
                delayed and current scaling    vs  x @ w in bf16.
  dense fwd+bwd the output and both gradients for a random cotangent
                (jax.vjp; every GEMM stays alive - a sum() loss would let
                XLA drop GEMMs)                vs  the same in bf16.

Each fp8kit output is checked against its anchor before anything is timed
(FP8-level tolerances; the process exits non-zero on a mismatch). Timing:
after a warm-up (which includes compilation and fp8kit's one-time cuBLASLt
plan build), several rounds that alternate fp8kit and the anchor; each
round times back-to-back calls ending in block_until_ready; the median
round counts.

    python benchmarks/bench_jax.py --out jax.json            # H200: 8192^3
    python benchmarks/bench_jax.py --size 256 --iters 3      # CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import fp8kit.jax as fj
from fp8kit.recipe import CurrentScaling, DelayedScaling

# Targets from ANCHORS.md (P5): fp8kit time ratio to the anchor (anchor_ms / fp8kit_ms).
TARGETS = {"gemm": 1.45, "dense fwd": 1.6, "dense fwd+bwd": 1.85}


def _time_pair(fns, args, warmup: int, iters: int, rounds: int) -> list[float]:
    """Median ms per call of each fn in `fns` (same args), rounds alternating."""
    for fn, a in zip(fns, args):
        for _ in range(warmup):
            out = fn(*a)
        jax.block_until_ready(out)
    samples = [[] for _ in fns]
    for _ in range(rounds):
        for i, (fn, a) in enumerate(zip(fns, args)):
            t0 = time.perf_counter()
            for _ in range(iters):
                out = fn(*a)
            jax.block_until_ready(out)
            samples[i].append((time.perf_counter() - t0) * 1e3 / iters)
    return [statistics.median(s) for s in samples]


def _rel_err(a, b) -> float:
    a = np.asarray(jnp.asarray(a, jnp.float32), np.float64)
    b = np.asarray(jnp.asarray(b, jnp.float32), np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _check(name: str, got, want, tol: float, failures: list[str]) -> float:
    err = _rel_err(got, want)
    if not np.isfinite(err) or err > tol:
        failures.append(f"{name}: relative error {err:.3g} > {tol}")
    return err


def bench_gemm(m, n, k, device, opts, failures):
    key_a, key_b = jax.random.split(jax.random.PRNGKey(0))
    a = jax.device_put(jax.random.normal(key_a, (m, k), jnp.float32).astype(jnp.float8_e4m3fn),
                       device)
    b = jax.device_put(jax.random.normal(key_b, (n, k), jnp.float32).astype(jnp.float8_e4m3fn),
                       device)
    one = jax.device_put(jnp.float32(1.0), device)
    A = fj.ScaledTensor(data=a, scale_inv=one, fp8_dtype="e4m3")
    B = fj.ScaledTensor(data=b, scale_inv=one, fp8_dtype="e4m3")
    fp8kit_fn = jax.jit(lambda A, B: fj.gemm(A, B, trans_b=True, out_dtype=jnp.bfloat16,
                                             use_split_accumulator=opts.split_accumulator,
                                             device=device))
    lax_fn = jax.jit(lambda a, b: jax.lax.dot_general(
        a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.bfloat16))
    err = _check("gemm", fp8kit_fn(A, B), lax_fn(a, b), 2e-2, failures)
    t_fp8, t_lax = _time_pair([fp8kit_fn, lax_fn], [(A, B), (a, b)], opts.warmup, opts.iters,
                              opts.rounds)
    flops = 2.0 * m * n * k
    return [dict(row="gemm", variant="e4m3 pre-quantized", shape=[m, n, k], fp8kit_ms=t_fp8,
                 anchor="jax.lax.dot_general e4m3 -> bf16", anchor_ms=t_lax,
                 fp8kit_tflops=flops / t_fp8 / 1e9, anchor_tflops=flops / t_lax / 1e9,
                 speedup=t_lax / t_fp8, target=TARGETS["gemm"], rel_err=err)]


def bench_dense(m, n, k, device, opts, failures):
    kx, kw, kg = jax.random.split(jax.random.PRNGKey(1), 3)
    x = jax.device_put(jax.random.normal(kx, (m, k), jnp.bfloat16), device)
    w = jax.device_put((jax.random.normal(kw, (k, n), jnp.float32) / np.sqrt(k))
                       .astype(jnp.bfloat16), device)
    dy = jax.device_put(jax.random.normal(kg, (m, n), jnp.bfloat16), device)

    def bf16_dense(x, w, s):
        return x @ w

    def fp8_dense(recipe):
        return lambda x, w, s: fj.dense(x, w, state=s, recipe=recipe)

    def fwd(f):
        return jax.jit(f)

    def fwd_bwd(f):
        @jax.jit
        def run(x, w, s, dy):
            y, vjp = jax.vjp(f, x, w, s)
            return y, vjp(dy)   # output, dx, dw (and the delayed state): every GEMM used
        return run

    flops_fwd = 2.0 * m * n * k
    rows = []
    base_fwd, base_fb = fwd(bf16_dense), fwd_bwd(bf16_dense)
    ref_y = base_fwd(x, w, None)
    ref_fb = base_fb(x, w, None, dy)
    for name, recipe in (("delayed", DelayedScaling()), ("current", CurrentScaling())):
        state = None
        if isinstance(recipe, DelayedScaling):
            # A state as training would have it: scales from these tensors' amaxes.
            state = fj.DelayedScalingState(
                amax_history=jnp.zeros((3, recipe.amax_history_len), jnp.float32),
                scale=jnp.asarray([448.0 / float(jnp.max(jnp.abs(x))),
                                   448.0 / float(jnp.max(jnp.abs(w))),
                                   57344.0 / float(jnp.max(jnp.abs(dy)))], jnp.float32))
            state = jax.device_put(state, device)
        f = fp8_dense(recipe)
        f_fwd, f_fb = fwd(f), fwd_bwd(f)
        err_y = _check(f"dense fwd {name}", f_fwd(x, w, state), ref_y, 0.05, failures)
        y, grads = f_fb(x, w, state, dy)
        err_dx = _check(f"dense dgrad {name}", grads[0], ref_fb[1][0], 0.12, failures)
        err_dw = _check(f"dense wgrad {name}", grads[1], ref_fb[1][1], 0.12, failures)
        t8, t16 = _time_pair([f_fwd, base_fwd], [(x, w, state), (x, w, None)], opts.warmup,
                             opts.iters, opts.rounds)
        rows.append(dict(row="dense fwd", variant=name, shape=[m, n, k], fp8kit_ms=t8,
                         anchor="bf16 x @ w", anchor_ms=t16, fp8kit_tflops=flops_fwd / t8 / 1e9,
                         anchor_tflops=flops_fwd / t16 / 1e9, speedup=t16 / t8,
                         target=TARGETS["dense fwd"], rel_err=err_y))
        t8, t16 = _time_pair([f_fb, base_fb], [(x, w, state, dy), (x, w, None, dy)],
                             opts.warmup, opts.iters, opts.rounds)
        rows.append(dict(row="dense fwd+bwd", variant=name, shape=[m, n, k], fp8kit_ms=t8,
                         anchor="bf16 (jax.vjp)", anchor_ms=t16,
                         fp8kit_tflops=3 * flops_fwd / t8 / 1e9,
                         anchor_tflops=3 * flops_fwd / t16 / 1e9, speedup=t16 / t8,
                         target=TARGETS["dense fwd+bwd"], rel_err=max(err_dx, err_dw)))
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=8192, help="M = N = K (default 8192)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20, help="calls per timed round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--split-accumulator", action="store_true",
                   help="gemm row: FP32-promoted accumulation (default: fast accumulation)")
    p.add_argument("--out", help="write the results as JSON here")
    opts = p.parse_args()

    device = jax.devices()[0]
    s = opts.size
    failures: list[str] = []
    rows = bench_gemm(s, s, s, device, opts, failures)
    rows += bench_dense(s, s, s, device, opts, failures)

    print(f"fp8kit.jax vs JAX on {device.device_kind} ({device.platform}), jax {jax.__version__}")
    head = f"{'row':<14} {'variant':<19} {'fp8kit ms':>10} {'anchor ms':>10} {'fp8kit TF/s':>12} " \
           f"{'speedup':>8} {'target':>7} {'rel err':>8}  anchor"
    print(head)
    print("-" * len(head))
    for r in rows:
        ok = "ok" if r["speedup"] >= r["target"] else "MISS"
        print(f"{r['row']:<14} {r['variant']:<19} {r['fp8kit_ms']:>10.3f} {r['anchor_ms']:>10.3f} "
              f"{r['fp8kit_tflops']:>12.1f} {r['speedup']:>7.2f}x {r['target']:>5.2f}x "
              f"{r['rel_err']:>8.4f}  {r['anchor']} [{ok}]")
    for f in failures:
        print("OUTPUT CHECK FAILED:", f)
    if opts.out:
        with open(opts.out, "w") as fh:
            json.dump(dict(device=device.device_kind, platform=device.platform,
                           jax=jax.__version__, size=s, rows=rows, failures=failures), fh, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
