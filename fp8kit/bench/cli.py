"""python -m fp8kit.bench: fp8kit's benchmark suite.

Every row times fp8kit next to its anchor (the peer or limit it is
compared with) in the same run on the same inputs, after checking that
fp8kit's output matches the anchor's, and compares the ratio with the
row's target (docs/benchmarks.md). Sections: gemm (per-tensor P1,
block-scaled P6-gemm), quantize (P2), linear (PyTorch Linear P3 and,
under BlockScaling, P6-linear; JAX dense P5; fwd and fwd+bwd), overhead
(per-call time, P4; with --profile also a torch.profiler table of the
per-call path), fused (the LayerNormMLP / LayerNormLinear blocks of
PyTorch and JAX, for information) and grouped (the mixture-of-experts
GroupedLinear, P11). Writes a JSON file and one PNG per
section.

On a machine without a CUDA GPU it runs a quick mode (tiny sizes, a few
iterations) that checks the suite works end to end; its numbers come from
fp8kit's CPU reference kernels and are not performance claims.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import pathlib
import sys
import time
import traceback

from fp8kit._source_tree import source_tree_hint
from fp8kit.models import cli_support

SECTIONS = ("gemm", "quantize", "linear", "overhead", "fused", "grouped", "compile")
# Sections run in this order; each is a module with cases(ctx).
_MODULES = {"gemm": ["fp8kit.bench.gemm", "fp8kit.bench.gemm_block"],
            "quantize": ["fp8kit.bench.quantize"],
            "linear": ["fp8kit.bench.linear_torch", "fp8kit.bench.dense_jax"],
            "overhead": ["fp8kit.bench.overhead"],
            "fused": ["fp8kit.bench.fused_torch", "fp8kit.bench.norm_cast",
                      "fp8kit.bench.norm_backward", "fp8kit.bench.act_cast",
                      "fp8kit.bench.mlp_jax"],
            "grouped": ["fp8kit.bench.grouped_torch"],
            "compile": ["fp8kit.bench.compile_torch"]}
# --sections also takes one module of a section with two (the PyTorch or the JAX
# half of "linear" or of "fused", the block-scaled part of "gemm"), except the
# one named as its section.
_PARTS = {m.rsplit(".", 1)[1]: (s, m) for s, mods in _MODULES.items() if len(mods) > 1
          for m in mods if m.rsplit(".", 1)[1] not in _MODULES}
NOT_A_CLAIM = ("CPU quick mode: this run checks that the suite works end to end. Its numbers "
               "come from fp8kit's CPU reference kernels and tiny sizes: they are NOT "
               "performance claims.")
QUICK_ON_GPU = ("quick mode on a GPU: tiny sizes, few iterations - a smoke run, not a "
                "performance claim.")


def _parser():
    p = argparse.ArgumentParser(prog="python -m fp8kit.bench",
                                description=__doc__.split("\n\n")[1].replace("\n", " "))
    p.add_argument("--out", default=os.path.join("out", "bench"),
                   help="directory for bench.json and the PNGs (default out/bench)")
    p.add_argument("--json", default=None,
                   help="JSON path (default OUT/bench.json; a directory: DIR/bench.json)")
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help=f"comma-separated subset of {','.join(SECTIONS)} (or of "
                        f"{','.join(_PARTS)}: one part of a section)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true",
                      help="tiny sizes, few iterations (the default without a GPU)")
    mode.add_argument("--full", action="store_true",
                      help="the sizes the targets are set at (the default with a GPU; "
                           "needs one)")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds per function")
    p.add_argument("--gemm-shapes", default="",
                   help="GEMM section: comma-separated MxNxK list instead of the target "
                        "shapes")
    p.add_argument("--no-compile", action="store_true",
                   help="skip the torch.compile peers (they compile for a while)")
    p.add_argument("--profile", action=argparse.BooleanOptionalAction, default=None,
                   help="overhead section: also a torch.profiler table of the per-call path "
                        "(printed, in the JSON and in OUT/profile_overhead.txt; default: on "
                        "in the full mode on a GPU)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 when a target is missed (default: only on errors)")
    p.add_argument("--plain-progress", action="store_true",
                   help="simple progress lines even if tqdm is installed")
    return p


def _shapes(text: str) -> tuple:
    """The (M, N, K) of --gemm-shapes; ValueError for a list that is not
    MxNxK[,MxNxK...] or a shape fp8kit's FP8 GEMMs cannot run (K, read
    contiguously, a multiple of 16; N, the output's rows of 16 bytes, and M
    for the block-scaled GEMM, multiples of 8)."""
    try:
        shapes = tuple(tuple(int(v) for v in s.lower().split("x")) for s in text.split(",") if s)
    except ValueError:
        shapes = None
    if shapes is None or any(len(s) != 3 or min(s) < 1 for s in shapes):
        raise ValueError(f"--gemm-shapes: expected MxNxK[,MxNxK...] of positive sizes, got "
                         f"{text!r}")
    for m, n, k in shapes:
        if m % 8 or n % 8 or k % 16:
            raise ValueError(f"--gemm-shapes: {m}x{n}x{k}: the FP8 GEMMs need M and N "
                             "multiples of 8 and K a multiple of 16")
    return shapes


def _modules(sections):
    """[(section, module name)] in the suite's order, for --sections names."""
    chosen = set()
    for s in sections:
        chosen.update([(s, m) for m in _MODULES[s]] if s in _MODULES else [_PARTS[s]])
    return [(s, m) for s, mods in _MODULES.items() for m in mods if (s, m) in chosen]


def _checked(args):
    """(sections, GEMM shapes, JSON path, plot directory or None) from the
    arguments, the output directories created and checked writable;
    ValueError naming a bad argument or a missing package, before anything
    is measured."""
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    bad = [s for s in sections if s not in SECTIONS and s not in _PARTS]
    if bad or not sections:
        raise ValueError(f"--sections: unknown {bad}; choose from "
                         f"{', '.join(SECTIONS + tuple(_PARTS))}")
    if args.rounds is not None and args.rounds < 1:
        raise ValueError(f"--rounds={args.rounds} must be >= 1")
    shapes = _shapes(args.gemm_shapes)
    cli_support.require("torch", "torch", "most of the suite's anchors are PyTorch ops")
    plot_dir = None if args.no_plots else pathlib.Path(args.out)
    if plot_dir is not None:
        cli_support.require("matplotlib", "bench", "fp8kit.bench plots its results with it",
                            "run with --no-plots")
        cli_support.writable_dir(plot_dir, "--out")
    json_path = (cli_support.output_path(args.json, "bench.json") if args.json
                 else pathlib.Path(args.out) / "bench.json")
    cli_support.writable_dir(json_path.parent, "--json" if args.json else "--out")
    return sections, shapes, json_path, plot_dir


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        sections, shapes, json_path, plot_dir = _checked(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    # JAX must not take 75% of GPU memory: PyTorch shares the GPU in this process.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

    try:
        import torch
        import fp8kit.torch  # noqa: F401  (the compiled extension, before anything is measured)
    except ImportError as e:
        print(f"error: fp8kit.bench: {e}{source_tree_hint()}", file=sys.stderr)
        return 2

    from fp8kit.bench import meta, plots, progress, results, timing
    from fp8kit.bench.context import Context
    from fp8kit.bench.results import Row

    has_gpu = torch.cuda.is_available()
    if args.full and not has_gpu:
        print("error: --full needs a CUDA GPU: on the CPU fp8kit runs its reference kernels, which "
              "are for correctness, not speed. Run without --full for the quick mode.",
              file=sys.stderr)
        return 2
    quick = args.quick or not has_gpu
    device = "cuda" if has_gpu else "cpu"
    if device == "cuda":
        import fp8kit.torch as ft
        if not ft.built_with_cuda():
            print("error: a CUDA GPU is present but fp8kit was built without CUDA; rebuild with "
                  "-DFP8KIT_CUDA=ON (see README) or run with CUDA_VISIBLE_DEVICES= for the "
                  "CPU quick mode.", file=sys.stderr)
            return 2
    settings = timing.Settings.quick() if quick else timing.Settings()
    if args.rounds is not None:
        settings = dataclasses.replace(settings, rounds=args.rounds)
    ctx = Context(quick=quick, torch_device=device, settings=settings,
                  gemm_shapes=shapes, torch_compile=not args.no_compile)
    ctx.profile = ctx.claims if args.profile is None else args.profile
    claim_note = (None if ctx.claims else NOT_A_CLAIM if device == "cpu" else QUICK_ON_GPU)

    print(f"fp8kit.bench: {'quick' if quick else 'full'} mode on {device}, sections "
          f"{', '.join(sections)}", flush=True)
    if claim_note:
        print(claim_note, flush=True)

    cases, rows = [], []
    for s, mod_name in _modules(sections):
        try:
            mod = importlib.import_module(mod_name)
            cases += mod.cases(ctx)
        except ImportError as e:  # a framework that is not installed
            rows.append(Row(s, mod_name.rsplit(".", 1)[1], "(not run)", 0, "-", "-",
                            error=f"cannot import: {e}"))
    t0 = time.perf_counter()
    bar = progress.bar(len(cases), plain=args.plain_progress)
    for case in cases:
        bar.set_description(case.name)
        try:
            rows += case.run()
        except Exception as e:  # noqa: BLE001  (one broken case must not stop the suite)
            traceback.print_exc()
            rows.append(Row(case.section, case.group, case.name, 0, "-", "-",
                            error=f"{type(e).__name__}: {e}"))
        bar.update(1)
    bar.close()

    for title, text in ctx.profiles.items():
        print(f"\n=== {title} ===\n{text}")
    print(results.table(rows, ctx.claims))
    summary = results.summarize_targets(rows, ctx.claims)
    print(results.summary_text(summary, ctx.claims))
    errors = [f"[{r.section}] {r.group} {r.case}: {r.error}" for r in rows if r.error]
    doc = {"suite": "fp8kit.bench", "mode": "quick" if quick else "full",
           "performance_claims": ctx.claims, "note": claim_note,
           "ratio": "anchor seconds / fp8kit seconds (> 1: fp8kit faster; quantization rows: "
                    "fraction of the bandwidth limit measured in the same run)",
           "meta": meta.collect(device), "settings": dataclasses.asdict(settings),
           "sections": sections, "seconds": time.perf_counter() - t0,
           "targets": summary, "errors": errors,
           "rows": [r.to_json(ctx.claims) for r in rows], "profiles": ctx.profiles}
    json_path.write_text(json.dumps(doc, indent=1))
    print(f"\nwrote {json_path.resolve()}")
    if ctx.profiles:
        prof_path = json_path.parent / "profile_overhead.txt"
        prof_path.write_text("".join(f"=== {t} ===\n{x}\n" for t, x in ctx.profiles.items()))
        print(f"wrote {prof_path.resolve()}")
    if plot_dir is not None:
        note = claim_note.split(":")[0] + ": not performance claims" if claim_note else \
            f"{doc['meta'].get('device', device)}, {doc['meta']['time']}"
        for p in plots.plot_all(rows, plot_dir, note):
            print(f"wrote {p.resolve()}")
    if claim_note:
        print(claim_note)
    for e in errors:
        print("ERROR", e)
    missed = [t for t, e in summary.items() if e["met"] is False]
    if missed:
        print("targets not met: " + ", ".join(missed))
    return 1 if errors or (args.strict and missed) else 0
