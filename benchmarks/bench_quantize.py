"""FP8 quantization speed on a GPU, next to its anchors, in one run (ANCHORS.md P2).

Measures, for bf16 inputs of 8192x8192, 16384x8192 and 8192x28672:
  copy          torch clone of the input (device-to-device copy; bytes read + written)
  delayed_ct    fp8kit delayed-scaling cast+transpose: e4m3 rowwise + columnwise + amax, one pass
  delayed_row   fp8kit delayed-scaling rowwise only (+ amax)
  current_ct    fp8kit current-scaling cast+transpose (amax pass + cast pass)
  compile_*     torch.compile of the same computation written in PyTorch (the anchor)

Bandwidth counts 4 bytes per element for cast+transpose (2 read, 1 + 1 written) and 3 for
rowwise only, as ANCHORS.md does. "% copy" is that bandwidth over the copy bandwidth of the
same input measured in the same run. Current scaling must read the input twice, so its
"% 2-pass" is the time a copy-speed kernel would need for 6 bytes per element (2 + 2 read,
1 + 1 written) over the measured time.

Every fp8kit result is checked bit for bit against an eager PyTorch reference before it is
timed (torch's float8 cast is round-to-nearest-even; the reference clamps to +-448 first,
which is fp8kit's saturation). fp8kit's Python ops allocate their outputs on each call (the
caching allocator makes that cheap); the timings include it, as they do for torch.compile.

    python benchmarks/bench_quantize.py --out results.json [--iters 20] [--no-compile]
"""

import argparse
import json
import statistics
import sys
import time

import torch

E4M3_MAX = 448.0
SHAPES = [(8192, 8192), (16384, 8192), (8192, 28672)]


def load_ext():
    try:
        from fp8kit import _torch_ext as ext  # noqa: PLC0415
    except ImportError as e:  # pragma: no cover - depends on the build
        sys.exit(f"bench_quantize: cannot import fp8kit._torch_ext ({e}); build fp8kit with CUDA first")
    for name in ("quantize", "quantize_current_scaling"):
        if not hasattr(ext, name):
            sys.exit(f"bench_quantize: fp8kit._torch_ext has no '{name}'")
    return ext


def time_ms(fn, iters, warmup, repeats):
    """Median over `repeats` of the mean time per call of `iters` back-to-back calls (CUDA events;
    wall clock in the CPU smoke mode)."""
    for _ in range(warmup):
        fn()
    if not torch.cuda.is_available():
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            samples.append((time.perf_counter() - t0) * 1e3 / iters)
        return statistics.median(samples)
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / iters)
    return statistics.median(samples)


# ------------------------------------------------------------ references --

def ref_delayed(x, scale):
    """amax + cast + transpose with a given scale, in PyTorch."""
    amax = x.abs().amax().float()
    y = (x.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return y, y.t().contiguous(), amax


def ref_current(x):
    """Current scaling in PyTorch: amax, scale = 448 / amax (1 for zero/non-finite), cast, transpose."""
    amax = x.abs().amax().float()
    ok = torch.isfinite(amax) & (amax > 0)
    scale = torch.where(ok, E4M3_MAX / amax, torch.ones_like(amax))
    y = (x.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return y, y.t().contiguous(), scale, amax


def ref_current_exact(x):
    """ref_current with the scale and scale_inv divided on the CPU: on CUDA, torch evaluates
    `448 / t` as 448 * reciprocal(t), which is not the correctly rounded quotient fp8kit gives."""
    amax = x.abs().amax().float()
    a = amax.cpu()
    scale = torch.tensor(E4M3_MAX) / a if bool(torch.isfinite(a) & (a > 0)) else torch.tensor(1.0)
    y = (x.float() * scale.to(x.device)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return y, y.t().contiguous(), scale, torch.tensor(1.0) / scale, amax


def same_bytes(a, b):
    return a is not None and b is not None and a.shape == b.shape and torch.equal(
        a.view(torch.uint8), b.view(torch.uint8))


def check(name, ok, failures):
    if not ok:
        failures.append(name)
        print(f"  CHECK FAILED: {name}", flush=True)
    return ok


# ------------------------------------------------------------------ main --

def run_shape(ext, shape, args, failures, compiled):
    rows, cols = shape
    n = rows * cols
    x = torch.randn(rows, cols, device=args.device, dtype=torch.bfloat16) * 3.0
    amax_true = x.abs().amax().float()
    scale = (E4M3_MAX / amax_true).reshape(1).contiguous()
    amax_out = torch.zeros(1, device=args.device, dtype=torch.float32)
    tag = f"{rows}x{cols}"
    print(f"-- {tag} bf16 -> e4m3", flush=True)

    # Correctness first.
    want_y, want_t, want_amax = ref_delayed(x, scale)
    data, data_t, scale_inv = ext.quantize(x, scale, "e4m3", True, True, amax_out)
    check(f"{tag} delayed rowwise", same_bytes(data, want_y), failures)
    check(f"{tag} delayed columnwise", same_bytes(data_t, want_t), failures)
    check(f"{tag} delayed amax", torch.equal(amax_out.reshape(()), want_amax), failures)
    want_scale_inv = torch.tensor(1.0) / scale.cpu().reshape(())  # IEEE division on the CPU
    check(f"{tag} delayed scale_inv", torch.equal(scale_inv.cpu().reshape(()), want_scale_inv), failures)
    data, data_t, _ = ext.quantize(x, scale, "e4m3", True, False, amax_out)
    check(f"{tag} rowwise-only", same_bytes(data, want_y) and data_t is None, failures)
    c_y, c_t, c_scale, c_scale_inv, c_amax = ext.quantize_current_scaling(x, "e4m3", True, True, 0.0, False)
    w_y, w_t, w_scale, w_scale_inv, w_amax = ref_current_exact(x)
    check(f"{tag} current rowwise", same_bytes(c_y, w_y), failures)
    check(f"{tag} current columnwise", same_bytes(c_t, w_t), failures)
    check(f"{tag} current scale", torch.equal(c_scale.cpu().reshape(()), w_scale.reshape(())), failures)
    check(f"{tag} current scale_inv", torch.equal(c_scale_inv.cpu().reshape(()), w_scale_inv.reshape(())),
          failures)
    check(f"{tag} current amax", torch.equal(c_amax.reshape(()), w_amax.reshape(())), failures)
    del data, data_t, c_y, c_t, want_y, want_t, w_y, w_t

    t = lambda fn: time_ms(fn, args.iters, args.warmup, args.repeats)  # noqa: E731
    res = {"shape": [rows, cols], "elements": n}
    res["copy_ms"] = t(lambda: x.clone())
    res["delayed_ct_ms"] = t(lambda: ext.quantize(x, scale, "e4m3", True, True, amax_out))
    res["delayed_row_ms"] = t(lambda: ext.quantize(x, scale, "e4m3", True, False, amax_out))
    res["current_ct_ms"] = t(lambda: ext.quantize_current_scaling(x, "e4m3", True, True, 0.0, False))
    if compiled is not None:
        comp_delayed, comp_current = compiled
        t0 = time.time()
        cy, ct, ca = comp_delayed(x, scale)
        # The compiled anchor may round differently only if inductor's cast differs; report it.
        res["compile_delayed_matches_eager"] = bool(same_bytes(cy, ref_delayed(x, scale)[0]))
        comp_current(x)
        res["compile_seconds"] = round(time.time() - t0, 1)
        del cy, ct, ca
        res["compile_delayed_ct_ms"] = t(lambda: comp_delayed(x, scale))
        res["compile_current_ct_ms"] = t(lambda: comp_current(x))

    bytes_el = x.element_size()
    copy_bw = 2 * bytes_el * n / (res["copy_ms"] * 1e-3) / 1e12  # TB/s, read + write
    res["copy_tbps"] = copy_bw

    def bw(ms, per_el):
        return per_el * n / (ms * 1e-3) / 1e12

    ct_bytes = 2 * bytes_el  # bf16 in (2) + two FP8 outputs (1 + 1) = 4
    row_bytes = bytes_el + 1
    two_pass_bytes = 2 * bytes_el + 2  # input read twice, both outputs written
    for key, per_el in (("delayed_ct", ct_bytes), ("delayed_row", row_bytes), ("current_ct", ct_bytes),
                        ("compile_delayed_ct", ct_bytes), ("compile_current_ct", ct_bytes)):
        if f"{key}_ms" not in res:
            continue
        tb = bw(res[f"{key}_ms"], per_el)
        res[f"{key}_tbps"] = tb
        res[f"{key}_pct_copy"] = 100.0 * tb / copy_bw
        if key.endswith("current_ct"):
            limit_ms = two_pass_bytes * n / (copy_bw * 1e12) * 1e3
            res[f"{key}_pct_two_pass"] = 100.0 * limit_ms / res[f"{key}_ms"]
    del x
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return res


def print_table(results):
    cols = [("delayed_ct", "fp8kit delayed cast+T (4 B/el)"), ("delayed_row", "fp8kit delayed rowwise (3 B/el)"),
            ("current_ct", "fp8kit current cast+T (4 B/el)"), ("compile_delayed_ct", "torch.compile delayed cast+T"),
            ("compile_current_ct", "torch.compile current cast+T")]
    print()
    print(f"{'shape':>12} {'what':<34} {'ms':>8} {'TB/s':>7} {'% copy':>7} {'% 2-pass':>9}")
    for r in results:
        tag = "x".join(str(d) for d in r["shape"])
        print(f"{tag:>12} {'copy (clone, read+write)':<34} {r['copy_ms']:8.4f} {r['copy_tbps']:7.3f} {100.0:7.1f}")
        for key, label in cols:
            if f"{key}_ms" not in r:
                continue
            two = f"{r[key + '_pct_two_pass']:9.1f}" if key + "_pct_two_pass" in r else ""
            print(f"{'':>12} {label:<34} {r[key + '_ms']:8.4f} {r[key + '_tbps']:7.3f} "
                  f"{r[key + '_pct_copy']:7.1f} {two}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--iters", type=int, default=20, help="calls per timed repeat")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats (the median is reported)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--no-compile", dest="compile", action="store_false",
                   help="skip the torch.compile anchor (it takes a while to compile)")
    p.add_argument("--shapes", default=None, help="e.g. 8192x8192,16384x8192 (default: the three P2 shapes)")
    p.add_argument("--device", default="cuda",
                   help="'cpu' runs the checks and a wall-clock timing on the CPU reference: a smoke "
                        "test of this script, not a measurement")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_quantize: needs a CUDA GPU (or --device cpu for a smoke test)")
    shapes = SHAPES if not args.shapes else [tuple(int(d) for d in s.split("x")) for s in args.shapes.split(",")]
    ext = load_ext()
    torch.manual_seed(0)
    failures = []
    # Static shapes (each shape compiles its own kernels, the anchor's best case).
    compiled = ((torch.compile(ref_delayed, dynamic=False), torch.compile(ref_current, dynamic=False))
                if args.compile else None)
    results = [run_shape(ext, s, args, failures, compiled) for s in shapes]
    print_table(results)
    out = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu (smoke test)",
        "torch": torch.__version__,
        "note": "fp8kit ops allocate their outputs per call (included in the timings)",
        "iters": args.iters, "repeats": args.repeats,
        "results": results,
        "check_failures": failures,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    if failures:
        print(f"\nbench_quantize: {len(failures)} correctness checks FAILED: {failures}")
        sys.exit(1)


if __name__ == "__main__":
    main()
