"""python -m fp8kit.models.step_profile: where the GPU time of one training
step of the Llama-style decoder goes, per kind of kernel (GEMMs, attention,
fp8kit's or TransformerEngine's casts, norms and activations, the
optimizer, the rest) and idle time, for each (framework, recipe) asked for;
with --kernels N, also the N kernels that took longest, by name.

    python -m fp8kit.models.step_profile --config 1b [--steps 5] \\
        [--frameworks torch,jax] [--recipes bf16,delayed,te-delayed] [--kernels 25]

Each run, in a fresh process: fp8kit.models.bench's trainer, `--warmup`
untimed steps, then `--steps` steps under torch.profiler (CUPTI sees JAX's
kernels too), split by fp8kit/bench/kernel_times.py. Needs a CUDA GPU (a CPU step has no
kernels to attribute).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import sys

from fp8kit.models import bench
from fp8kit.models.config import CONFIGS
from fp8kit.models.schedule import peak_learning_rate


def profile_run(framework: str, model_cfg, recipe_name: str, batch: int, warmup: int,
                steps: int, lr: float | None = None, kernels: int = 0) -> tuple:
    """({kind: microseconds per step}, kernel_times.top_kernels' `kernels`
    longest) of one (framework, recipe) run, at peak learning rate lr
    (None: TrainConfig's) as the benchmark's runs."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from fp8kit.bench import kernel_times
    from fp8kit.models.init import init_params
    train_cfg = bench.train_config(batch, warmup, steps, lr)
    make = bench.torch_trainer if framework == "torch" else bench.jax_trainer
    trainer, _, _ = make(model_cfg, train_cfg, recipe_name, init_params(model_cfg, train_cfg.seed))
    for _ in range(warmup):
        trainer.train_step()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        trainer.train_steps(steps)   # as the benchmark times them; returns once all have run
    ran = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
           if e.device_type == DeviceType.CUDA]
    return kernel_times.breakdown(ran, steps), kernel_times.top_kernels(ran, steps, kernels)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fp8kit.models.step_profile",
                                description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    p.add_argument("--config", choices=sorted(CONFIGS), default="1b")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--frameworks", default=",".join(bench.FRAMEWORKS))
    p.add_argument("--recipes", default=",".join(bench.RECIPES))
    p.add_argument("--kernels", type=int, default=0, metavar="N",
                   help="also list the N kernels that took longest (0: none)")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        frameworks = bench.choices(args.frameworks, bench.FRAMEWORKS, "--frameworks")
        recipes = bench.choices(args.recipes, bench.RECIPES + bench.TE_RECIPES, "--recipes")
        if args.kernels < 0:
            raise ValueError(f"--kernels={args.kernels} must be >= 0 (0: no kernel list)")
        import torch
        if not torch.cuda.is_available():
            raise ValueError("no CUDA GPU: a step on the CPU has no GPU kernels to attribute")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from fp8kit.bench import kernel_times
    model_cfg = CONFIGS[args.config]
    print(f"fp8kit.models.step_profile: config {args.config}, batch {args.batch} x seq "
          f"{model_cfg.seq_len}, {args.steps} profiled steps after {args.warmup}", flush=True)
    for fw in frameworks:
        for recipe in recipes:
            ctx = multiprocessing.get_context("spawn")
            with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
                times, top = pool.submit(profile_run, fw, model_cfg, recipe, args.batch,
                                         args.warmup, args.steps,
                                         peak_learning_rate(args.config), args.kernels).result()
            print(f"\n== {fw} {recipe}\n{kernel_times.table(times)}", flush=True)
            if top:
                print(kernel_times.kernel_table(top), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
