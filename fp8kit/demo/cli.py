"""python -m fp8kit.demo: train a small Llama-style decoder in FP8 (fp8kit)
and in bf16, in JAX and in PyTorch, then compare the losses.

The model is fp8kit.models' decoder (its seven projections per layer in
FP8, the q, k, v and the gate, up, down projections fused with the RMSNorm
before them; the rest in bf16) learning bytes of Python's own standard-library
source; all four runs start from the same weights and see the same
batches. Runs on the CPU by default, where FP8 goes through fp8kit's
reference kernels (written for correctness, slower than bf16 there), and
on the GPU when one is present. Prints progress, a table of final losses
and throughput, and writes a loss-curve PNG (plus a JSON file with every
loss) to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import pathlib
import sys
import time

from fp8kit._source_tree import source_tree_hint
from fp8kit.models import cli_support
from fp8kit.models.config import CONFIGS
from fp8kit.models.schedule import PEAK_LEARNING_RATES, TrainConfig

FRAMEWORKS = ("jax", "torch")
PLOT_NAME = "demo_loss.png"            # the plot's name in an --out directory
PLOT_SUFFIXES = (".png", ".svg", ".pdf")   # formats matplotlib writes with its own backends
# The demo's run: 300 steps of 4 x 128 tokens, a few minutes on 2 CPU cores.
DEMO_TRAIN = TrainConfig(steps=300, batch=4, lr=3e-3, warmup_steps=30)


def _parser() -> argparse.ArgumentParser:
    t = DEMO_TRAIN
    p = argparse.ArgumentParser(prog="python -m fp8kit.demo",
                                description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    p.add_argument("--config", choices=sorted(CONFIGS), default="tiny",
                   help="the model (fp8kit.models.config); the flags below override its sizes "
                        "(1b: the GPU convergence run)")
    p.add_argument("--steps", type=int, default=t.steps, help="training steps per run")
    p.add_argument("--batch", type=int, default=t.batch, help="sequences per step")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (default: the config's)")
    p.add_argument("--hidden", type=int, help="model width (multiple of 16)")
    p.add_argument("--layers", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--ffn", type=int, help="MLP width (multiple of 16)")
    p.add_argument("--lr", type=float,
                   help=f"peak AdamW learning rate (default: {t.lr:g}, or the config's own "
                        "where fp8kit.models.schedule.PEAK_LEARNING_RATES gives one)")
    p.add_argument("--seed", type=int, default=t.seed)
    p.add_argument("--frameworks", default=",".join(FRAMEWORKS),
                   help="comma-separated subset of jax,torch")
    p.add_argument("--recipe", choices=("delayed", "current", "block"), default="delayed",
                   help="FP8 scaling: delayed (amax history, the default), current or "
                        "block (1x128 activations and gradients, 128x128 weights)")
    p.add_argument("--forward-fast-accumulation", action="store_true",
                   help="the per-tensor recipes' forward GEMMs accumulate in the tensor cores' "
                        "fast mode (TransformerEngine's default) instead of fp8kit's split "
                        "accumulation; the convergence check of that choice")
    p.add_argument("--float32-seams", action="store_true",
                   help="the FP8 runs' fused layers read the float32 residual stream at their "
                        "seams and return float32, keeping SwiGLU's input in float32 for "
                        "backward; costs memory (by default they take bf16 at their seams, as "
                        "the bf16 model's layers do, so that FP8's casts alone tell the FP8 "
                        "and bf16 losses apart)")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even if a GPU is present")
    p.add_argument("--out", default=os.path.join("out", PLOT_NAME),
                   help=f"loss-curve PNG (a .json with the same stem is written next to it); "
                        f"a directory gets DIR/{PLOT_NAME}, a name without a suffix .png")
    p.add_argument("--log-every", type=int, default=0,
                   help="print the loss every N steps (default: about 10 lines per run)")
    p.add_argument("--inspect-every", type=int, default=None, metavar="N",
                   help="log the FP8 runs' cast statistics every N steps beside the plot "
                        "(fp8kit.inspect; default: 20 times per run; 0: not)")
    return p


def _recipe(name: str, fast: bool = False):
    from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling, Format
    if name == "delayed":
        return DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=16, margin=0,
                              forward_fast_accumulation=fast)
    if name == "block":  # E4M3 everywhere, as block-scaled training usually runs
        return BlockScaling()
    return CurrentScaling(fp8_format=Format.HYBRID, forward_fast_accumulation=fast)


def _load_trainers(names, cpu: bool):
    """{framework: (trainer class, device, its fp8kit layers)}; a framework
    that cannot be imported is skipped with the reason (make demo installs
    both)."""
    trainers = {}
    for name in names:
        try:
            if name == "jax":
                import jax
                from fp8kit.models import llama_jax, train_jax
                device = jax.devices("cpu")[0] if cpu else train_jax.default_device()
                trainers[name] = (train_jax.JaxTrainer, device, llama_jax.FP8KIT_LAYERS)
            else:
                import torch
                from fp8kit.models import llama_torch, train_torch
                device = torch.device("cpu") if cpu else train_torch.default_device()
                cli_support.pin_torch_threads(device)
                trainers[name] = (train_torch.TorchTrainer, device, llama_torch.FP8KIT_LAYERS)
        except ImportError as e:
            print(f"skipping {name}: {e}{source_tree_hint()}", flush=True)
    return trainers


def _configs(args):
    """(LlamaConfig, TrainConfig) from the arguments; ValueError names a bad one."""
    sizes = {k: getattr(args, k) for k in ("hidden", "layers", "heads", "ffn", "seq_len")}
    model_cfg = dataclasses.replace(CONFIGS[args.config],
                                    **{k: v for k, v in sizes.items() if v is not None})
    lr = args.lr
    if lr is None:
        lr = PEAK_LEARNING_RATES.get(args.config, DEMO_TRAIN.lr)
    train_cfg = dataclasses.replace(DEMO_TRAIN, steps=args.steps, batch=args.batch, lr=lr,
                                    seed=args.seed, warmup_steps=max(1, args.steps // 10))
    return model_cfg, train_cfg


def _out_png(text: str) -> pathlib.Path:
    """The plot's path for --out (cli_support.output_path's rules), its
    directory checked writable; ValueError otherwise."""
    path = cli_support.output_path(text, PLOT_NAME)
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise ValueError(f"--out {text}: the plot is written as {', '.join(PLOT_SUFFIXES)}: "
                         "end it in one of those (the JSON goes beside it) or in none")
    cli_support.writable_dir(path.parent, "--out")
    return path


def _checked(args):
    """(frameworks, LlamaConfig, TrainConfig, the plot's path) from the
    arguments; ValueError naming a bad one or a missing package, before
    anything is trained."""
    names = [n.strip() for n in args.frameworks.split(",") if n.strip()]
    bad = [n for n in names if n not in FRAMEWORKS]
    if bad or not names:
        raise ValueError(f"--frameworks: unknown {bad}; choose from {', '.join(FRAMEWORKS)}")
    if args.forward_fast_accumulation and args.recipe == "block":
        raise ValueError("--forward-fast-accumulation: block scaling's GEMMs have no fast "
                         "accumulation (cuBLASLt's block-scaled GEMM); use it with --recipe "
                         "delayed or current")
    for name in ("seed", "log_every", "inspect_every"):
        value = getattr(args, name)
        if value is not None and value < 0:
            raise ValueError(f"--{name.replace('_', '-')}={value} must be >= 0")
    model_cfg, train_cfg = _configs(args)
    cli_support.check_seq_len(model_cfg.seq_len, evaluates=True)
    for name in names:
        cli_support.require(name, name, "the demo trains in it", "leave it out of --frameworks")
    cli_support.require("matplotlib", "bench", "the demo plots the loss curves with it")
    return names, model_cfg, train_cfg, _out_png(args.out)


def _cpu_warning(trainers, model_cfg, train_cfg):
    """cli_support.long_cpu_run's warning for the runs that will train on the CPU."""
    from fp8kit.demo.run import device_name
    tokens = train_cfg.steps * train_cfg.batch * model_cfg.seq_len
    return cli_support.long_cpu_run(model_cfg, [
        (tokens, is_fp8) for _, device, _ in trainers.values() if device_name(device) == "cpu"
        for is_fp8 in (True, False)])


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        names, model_cfg, train_cfg, out_png = _checked(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    # JAX must not take 75% of GPU memory when PyTorch shares the GPU.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

    from fp8kit.demo import inspection, report, run
    from fp8kit.models.init import init_params

    recipe = _recipe(args.recipe, args.forward_fast_accumulation)
    recipe_name = f"{args.recipe} scaling, {recipe.fp8_format.name} format" + (
        ", fast forward accumulation" if args.forward_fast_accumulation else "") + (
        ", float32 seams" if args.float32_seams else "")
    every = args.log_every or max(1, train_cfg.steps // 10)
    inspect_every = (max(1, train_cfg.steps // 20) if args.inspect_every is None
                     else args.inspect_every)
    print(f"fp8kit demo: a Llama-style decoder ({model_cfg.layers} layers, hidden "
          f"{model_cfg.hidden}, {model_cfg.heads} heads, {model_cfg.num_params() / 1e6:.2f}M "
          f"parameters) learning bytes of Python's standard-library source: {train_cfg.steps} "
          f"steps of {train_cfg.batch} x {model_cfg.seq_len} = "
          f"{train_cfg.batch * model_cfg.seq_len} tokens, in FP8 ({recipe_name}) and in bf16.",
          flush=True)

    t_start = time.perf_counter()
    trainers = _load_trainers(names, args.cpu)
    if not trainers:
        print("error: neither JAX nor PyTorch could be loaded", file=sys.stderr)
        return 1
    warning = _cpu_warning(trainers, model_cfg, train_cfg)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    params = init_params(model_cfg, train_cfg.seed)
    results, statistics_files = [], []
    for fw, (trainer_cls, device, fp8_layers) in trainers.items():
        if args.float32_seams:
            fp8_layers = dataclasses.replace(fp8_layers, float32_seams=True)
        for precision, run_recipe in (("FP8", recipe), ("bf16", None)):
            label = f"{fw} {precision}"
            print(f"{label}: training", flush=True)
            log = inspection.open_log(out_png, fw, inspect_every) if run_recipe else None
            try:
                r = run.train(trainer_cls, model_cfg, train_cfg, run_recipe, params, device,
                              label, every, fp8_layers, log)
            finally:
                if log is not None:
                    log.close()
                    statistics_files.append(log.path)
            results.append(r)
            print(f"{label}: done in {r.seconds:.1f} s on {r.device}, held-out loss "
                  f"{r.val_loss:.4f}", flush=True)

    print()
    print(report.table(results))
    report.plot(results, model_cfg, train_cfg, recipe_name, out_png)
    out_json = out_png.with_suffix(".json")
    report.write_json(results, model_cfg, train_cfg, recipe_name, out_json)
    print(f"\nloss curves: {out_png.resolve()}\nall losses:  {out_json.resolve()}")
    if statistics_files:
        print(f"\nFP8 cast statistics, every {inspect_every} steps:\n"
              f"{inspection.report(statistics_files)}")
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
