"""python -m fp8kit.demo: train the same small model in FP8 (fp8kit) and in
bf16, in JAX and in PyTorch, then compare the losses.

Runs on the CPU by default (fp8kit's reference kernels: slow, so the model
is small) and on the GPU when one is present. Prints progress, a table of
final losses and wall times, text sampled from the FP8 models, and writes a
loss-curve PNG (plus a JSON file with every loss) to --out.
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
import sys
import time

from fp8kit._source_tree import source_tree_hint
from fp8kit.demo.task import Config

FRAMEWORKS = ("jax", "torch")


def _parser() -> argparse.ArgumentParser:
    d = Config()
    p = argparse.ArgumentParser(prog="python -m fp8kit.demo",
                                description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    p.add_argument("--steps", type=int, default=d.steps, help="training steps per run")
    p.add_argument("--batch", type=int, default=d.batch, help="tokens per step")
    p.add_argument("--hidden", type=int, default=d.hidden, help="MLP width (multiple of 16)")
    p.add_argument("--blocks", type=int, default=d.blocks, help="MLP blocks")
    p.add_argument("--lr", type=float, default=d.lr, help="Adam learning rate")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--frameworks", default=",".join(FRAMEWORKS),
                   help="comma-separated subset of jax,torch")
    p.add_argument("--recipe", choices=("delayed", "current"), default="delayed",
                   help="FP8 scaling: delayed (amax history, the default) or current")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even if a GPU is present")
    p.add_argument("--out", default=os.path.join("out", "demo_loss.png"),
                   help="loss-curve PNG (a .json with the same stem is written next to it)")
    p.add_argument("--log-every", type=int, default=0,
                   help="print the loss every N steps (default: about 10 lines per run)")
    p.add_argument("--no-sample", action="store_true", help="skip the text samples")
    return p


def _recipe(name: str):
    from fp8kit.recipe import CurrentScaling, DelayedScaling, Format
    if name == "delayed":
        return DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=16, margin=0)
    return CurrentScaling(fp8_format=Format.HYBRID)


class _Progress:
    """Prints `[jax fp8 ] step 30/300  loss 2.345  4.1 s` every N steps."""

    def __init__(self, label: str, total: int, every: int):
        self.label, self.total, self.every = label, total, every
        self.t0 = time.perf_counter()

    def __call__(self, step: int, loss: float) -> None:
        if step == 1 or step % self.every == 0 or step == self.total or not math.isfinite(loss):
            width = len(str(self.total))
            print(f"  [{self.label:<10}] step {step:>{width}}/{self.total}  loss {loss:7.4f}  "
                  f"{time.perf_counter() - self.t0:6.1f} s", flush=True)


def _load_trainers(names, cpu: bool):
    """{framework: train function}; a framework that cannot be imported is
    skipped with the reason (make demo installs both)."""
    trainers = {}
    for name in names:
        try:
            if name == "jax":
                from fp8kit.demo import train_jax
                device = train_jax.default_device(cpu)
                trainers[name] = (lambda *a, _d=device, _t=train_jax.train: _t(*a, device=_d))
            else:
                import torch
                from fp8kit.demo import train_torch
                device = torch.device("cpu") if cpu else train_torch.default_device()
                trainers[name] = (lambda *a, _d=device, _t=train_torch.train: _t(*a, device=_d))
        except ImportError as e:
            print(f"skipping {name}: {e}{source_tree_hint()}", flush=True)
    return trainers


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    names = [n.strip() for n in args.frameworks.split(",") if n.strip()]
    bad = [n for n in names if n not in FRAMEWORKS]
    if bad or not names:
        print(f"--frameworks: unknown {bad}; choose from {', '.join(FRAMEWORKS)}",
              file=sys.stderr)
        return 2
    cfg = Config(hidden=args.hidden, blocks=args.blocks, batch=args.batch, steps=args.steps,
                 lr=args.lr, seed=args.seed)
    try:
        cfg.check()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    # JAX must not take 75% of GPU memory when PyTorch shares the GPU.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

    from fp8kit.demo import report, task

    out_png = pathlib.Path(args.out)
    recipe = _recipe(args.recipe)
    recipe_name = f"{args.recipe} scaling, {recipe.fp8_format.name} format"
    every = args.log_every or max(1, cfg.steps // 10)
    print(f"fp8kit demo: a character-level language model ({cfg.blocks} transformer MLP blocks, "
          f"d_model {cfg.d_model}, hidden {cfg.hidden}) on generated text, {cfg.steps} steps of "
          f"{cfg.batch} characters, in FP8 ({recipe_name}) and in bf16.", flush=True)

    t_start = time.perf_counter()
    data = task.make_data(cfg)
    params = task.init_params(cfg)
    trainers = _load_trainers(names, args.cpu)
    if not trainers:
        print("error: neither JAX nor PyTorch could be loaded", file=sys.stderr)
        return 1
    results = []
    for fw, train in trainers.items():
        for precision in ("fp8", "bf16"):
            label = f"{fw} {precision}"
            print(f"{label}: training", flush=True)
            progress = _Progress(label, cfg.steps, every)
            results.append(train(cfg, data, params, recipe if precision == "fp8" else None,
                                 progress))
            r = results[-1]
            print(f"{label}: done in {r.seconds:.1f} s on {r.device}, held-out loss "
                  f"{r.val_loss:.4f}", flush=True)

    print()
    print(report.table(results, cfg))
    if not args.no_sample:
        print()
        for r in results:
            if r.precision == "fp8":
                lines = report.sample(r, cfg, seed=cfg.seed).strip().splitlines()
                print(f"text sampled from the FP8 {r.framework} model: "
                      f"{' / '.join(lines[:2])}")
    report.plot(results, cfg, recipe_name, out_png)
    out_json = out_png.with_suffix(".json")
    report.write_json(results, cfg, recipe_name, out_json)
    print(f"\nloss curves: {out_png.resolve()}\nall losses:  {out_json.resolve()}")
    print(f"total wall time {time.perf_counter() - t_start:.1f} s")
    diverged = [r.label for r in results
                if not all(math.isfinite(v) for v in r.losses) or not math.isfinite(r.val_loss)]
    if diverged:
        print(f"error: non-finite loss in {', '.join(diverged)}", file=sys.stderr)
        return 1
    skipped = [n for n in names if n not in trainers]
    if skipped:
        print(f"error: {', '.join(skipped)} could not be loaded (see above)", file=sys.stderr)
        return 1
    return 0
