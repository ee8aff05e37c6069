"""python -m fp8kit.models.bench: training throughput and peak memory of
the Llama-style decoder, bf16 vs fp8kit's delayed, current and block
scaling, in PyTorch and JAX.

    python -m fp8kit.models.bench --config 1b [--batch 1] [--steps 30]
    python -m fp8kit.models.bench --config tiny --seq-len 64   # a CPU smoke run
    python -m fp8kit.models.bench --config 1b --frameworks torch \\
        --recipes bf16,delayed,current,torchao --compile      # compiled steps too

Each (framework, recipe, mode) runs in a fresh process (so that one run's
allocator caches and compiled programs do not count against the next):
the training step (forward, backward, clipping, AdamW) runs `--warmup`
times untimed (compilation, autotuning), then `--steps` times timed.
The recipes te-delayed, te-current and te-block (a CUDA GPU with
TransformerEngine installed) run the same model with TransformerEngine's
layers in place of fp8kit's, under TE's autocast with the same recipe
settings (bench_peers.py): in PyTorch te.Linear, te.LayerNormLinear,
te.LayerNormMLP and, for a mixture-of-experts config, te.GroupedLinear
for the experts, each expert's tokens padded to a multiple of 16 as TE's
FP8 grouped GEMM needs (moe_te.py); in JAX, for dense configs and not
te-block, its flax LayerNormDenseGeneral, DenseGeneral and LayerNormMLP
(fp8kit/bench/te_peer.py's jax_layers). A TE run that cannot be made
says why on its row.

The mode column says how a step runs: PyTorch "eager", or "compile" with
--compile, which adds a compiled run of every PyTorch recipe next to its
eager one (TorchTrainer(compile=True): the whole decoder's forward, loss
and backward as one torch.compile(fullgraph=True) graph, the optimizer
step eager). A compiled run compiles in its first warm-up step, so
--compile needs --warmup >= 1; a run that does not compile reports
dynamo's reason instead of numbers; --compile-only leaves the eager runs
out (a whole 1b compile takes minutes, and the eager rows are the models
stage's). JAX steps are always jit-compiled
(mode "jit"). The recipe torchao (PyTorch, with --compile) is the bf16
model with every projection but the lm_head (which stays bf16, as in
fp8kit's recipes) converted by torchao.float8's convert_to_float8_training
with tensorwise scaling; it runs compiled only, since torchao's eager
Float8Linear is slower than bf16 (its casts are separate PyTorch ops that
only inductor fuses).

--inspect-every N adds, after each fp8kit FP8 run (eager or jit), the same
run with the FP8 cast statistics logged every N steps (fp8kit.inspect;
both trainers' `statistics`, into a temporary file): the row's recipe is
"<recipe>/iN", and a line under the table gives its tokens/s as a
fraction of the plain run's, the cost of leaving inspection on.

For a mixture-of-experts config, a line under the table gives each run's
routing balance over its timed steps (the load-balancing loss per layer,
1 when the router spreads the tokens evenly): a run whose routing
collapsed times one expert's GEMM doing every token's work.
--balanced-routing sends each token's top_k slots to the experts
round-robin (LlamaConfig.router_balanced), so every expert does the same
work, however the router trains.

The accumulation column says how each run's FP8 GEMMs accumulate
(bench_peers.accumulation): fp8kit's "split" (FP32-promoted) by default,
TE-PyTorch's and torchao's "fast fwd", TE-JAX's "fast" (every GEMM). For
rows that compare like with like, --forward-fast-accumulation runs fp8kit's
delayed and current recipes with the forward GEMM fast (the recipes'
forward_fast_accumulation, TE-PyTorch's setting) and
--te-jax-split-accumulation runs TE-JAX with every GEMM split (fp8kit's
setting).

By default fp8kit's fused layers take bf16 at their seams, as the bf16
model's layers and TransformerEngine's have it (fp8kit/models/llama_torch.py
says why); --float32-seams has them read the float32 residual stream and
float32 weights and return float32, which keeps SwiGLU's input for
backward in float32 instead of bf16 (2 x 2 x ffn bytes more per token and
layer).

The steps follow the training recipe of fp8kit/models/schedule.py from
its start (its learning-rate warmup included: at the peak rate from the
first step the bf16 8b_slice diverged within 13 steps), at its peak
learning rate but where schedule.PEAK_LEARNING_RATES gives a config its
own (there says why mixtral_slice trains at 3e-4), and a run whose
final loss is more than a nat above where it started (its first step's
loss, or the uniform guess ln(vocab) where that is higher) is marked
diverged: its numbers time a broken training run, not the model's. The
start is the run's own because a wide model starts above ln(vocab): its
logits spread by about init_std * sqrt(hidden) (1.28 at hidden 4096), and
hidden-4096 variants of mixtral_slice started at losses of 6.25 to 6.61,
around ln(256) + 1 = 6.55 itself.

tokens/s = batch x seq_len x steps / their wall time, the host waiting
for the device once, for the last step's loss (as a training loop that
logs every --steps steps: each step is queued while the last one runs);
'x bf16' divides
it by the tokens/s of the bf16 run of the same framework and mode. Peak memory is the
device allocator's peak over the timed steps (PyTorch on CUDA) or over the
run (JAX, whose allocator has no reset); a CPU run reports none. On a CPU
the FP8 runs use fp8kit's reference kernels: the numbers check that the
benchmark works, they are not performance claims (the table says so).
There PyTorch runs one thread, as in the demo (cli_support.pin_torch_threads
says why), and a run estimated to take hours is warned about before it
starts.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import importlib.util
import json
import math
import multiprocessing
import os
import pathlib
import sys
import tempfile
import time

from fp8kit.bench import te_peer
from fp8kit.models import bench_peers, bench_table, cli_support
from fp8kit.models.config import CONFIGS
from fp8kit.models.schedule import TrainConfig, peak_learning_rate

FRAMEWORKS = ("torch", "jax")
RECIPES = ("bf16", "delayed", "current", "block")
TE_RECIPES = bench_peers.TE_RECIPES         # TransformerEngine
TORCHAO = "torchao"                          # torchao's Float8Linear, PyTorch only, compiled
TORCH_ONLY = (TORCHAO,)
CPU_NOTE = ("On the CPU the FP8 runs use fp8kit's reference kernels, written for correctness: "
            "these numbers check that the benchmark works, they are not performance claims.")


def _recipe(name: str, forward_fast: bool = False):
    """fp8kit's recipe of that name; forward_fast: the per-tensor recipes'
    forward_fast_accumulation."""
    from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling
    fast = {"forward_fast_accumulation": forward_fast}
    return {"bf16": None, "delayed": DelayedScaling(**fast), "current": CurrentScaling(**fast),
            "block": BlockScaling()}[name]


def _statistics_log(inspect_every: int):
    """A StatsLog into a temporary directory (removed with the process's
    temporary files), or None when inspect_every is 0."""
    if not inspect_every:
        return None
    from fp8kit.inspect import StatsLog
    return StatsLog(pathlib.Path(tempfile.mkdtemp(prefix="fp8kit-bench-")) / "run.jsonl",
                    every=inspect_every)


def torch_trainer(model_cfg, train_cfg, recipe_name, params, compile: bool = False,
                  float32_seams: bool = False, inspect_every: int = 0,
                  forward_fast: bool = False):
    """(TorchTrainer for the recipe named (RECIPES or TORCH_ONLY), compiled
    when asked, reset the peak-memory counter, read it); RuntimeError when
    TE or torchao is asked for but missing. float32_seams: fp8kit's fused
    layers read the float32 residual stream at their seams (by default they
    take bf16, as the bf16 model's layers do); forward_fast: fp8kit's
    delayed and current recipes run the forward GEMM with fast accumulation."""
    import torch
    from fp8kit.models.llama_torch import FP8KIT_LAYERS
    from fp8kit.models.train_torch import TorchTrainer, default_device
    cli_support.pin_torch_threads(default_device())
    if recipe_name in TE_RECIPES:
        trainer = TorchTrainer(model_cfg, train_cfg, params=params, compile=compile,
                               **bench_peers.torch_te(model_cfg, recipe_name))
    elif recipe_name == TORCHAO:
        trainer = TorchTrainer(model_cfg, train_cfg, None, params=params,
                               convert=bench_peers.torchao_convert(), compile=compile)
    else:
        trainer = TorchTrainer(model_cfg, train_cfg, _recipe(recipe_name, forward_fast),
                               params=params, compile=compile,
                               layers=_seams(FP8KIT_LAYERS, float32_seams),
                               statistics=_statistics_log(inspect_every))
    if trainer.device.type != "cuda":
        return trainer, lambda: None, lambda: None
    return (trainer, lambda: torch.cuda.reset_peak_memory_stats(trainer.device),
            lambda: torch.cuda.max_memory_allocated(trainer.device))


def jax_trainer(model_cfg, train_cfg, recipe_name, params, float32_seams: bool = False,
                inspect_every: int = 0, forward_fast: bool = False, te_split: bool = False):
    """As torch_trainer, for JAX (whose allocator's peak has no reset);
    te_split: TE-JAX's GEMMs accumulate split (set in this process's
    environment, which TE reads as it traces a GEMM: call it in the run's
    own process)."""
    from fp8kit.models.llama_jax import FP8KIT_LAYERS
    from fp8kit.models.train_jax import JaxTrainer
    if recipe_name in TE_RECIPES:
        if te_split:
            os.environ[bench_peers.TE_JAX_SPLIT_ENV] = "1"
        trainer = JaxTrainer(model_cfg, train_cfg, _recipe(recipe_name[len("te-"):]),
                             params=params,
                             layers=bench_peers.jax_te_layers(model_cfg, recipe_name))
    else:
        trainer = JaxTrainer(model_cfg, train_cfg, _recipe(recipe_name, forward_fast),
                             params=params, layers=_seams(FP8KIT_LAYERS, float32_seams),
                             statistics=_statistics_log(inspect_every))
    return trainer, lambda: None, lambda: (trainer.device.memory_stats() or {}).get(
        "peak_bytes_in_use")


def _seams(layers, float32_seams: bool):
    """fp8kit's FP8 layers with bf16 seams (their default) or float32 ones."""
    return dataclasses.replace(layers, float32_seams=float32_seams)


def modes(framework: str, recipe_name: str, compile: bool, compile_only: bool = False) -> tuple:
    """The modes one (framework, recipe) runs in (the module's docstring says why)."""
    if framework == "jax":
        return ("jit",)
    if recipe_name == TORCHAO or compile_only:
        return ("compile",)
    return ("eager", "compile") if compile else ("eager",)


def _compile_error() -> type:
    """What torch.compile raises for a model it cannot compile (a graph
    break under fullgraph=True, a backend failure)."""
    import torch._dynamo.exc
    return torch._dynamo.exc.TorchDynamoException


def train_config(batch: int, warmup: int, steps: int, lr: float | None = None) -> TrainConfig:
    """The training recipe of a measured run: TrainConfig's own, learning-rate
    warmup included, over warmup + steps steps, at peak rate lr (None:
    TrainConfig's)."""
    return TrainConfig(steps=warmup + steps, batch=batch,
                       **({} if lr is None else {"lr": lr}))


def diverged(loss: float, model_cfg, first_loss: float | None = None) -> bool:
    """Whether a run's final loss is more than a nat worse than where it
    started: its first step's loss (the untrained model's), or guessing
    uniformly (ln(vocab)) where that is higher (the module doc says why)."""
    start = math.log(model_cfg.vocab)
    if first_loss is not None and math.isfinite(first_loss):
        start = max(start, first_loss)
    return not math.isfinite(loss) or loss > start + 1.0


def measure(framework: str, model_cfg, recipe_name: str, mode: str, batch: int, warmup: int,
            steps: int, float32_seams: bool = False, inspect_every: int = 0,
            lr: float | None = None, forward_fast: bool = False,
            te_split: bool = False) -> dict:
    """One (framework, recipe, mode) run in this process, with the FP8 cast
    statistics logged every inspect_every steps (0: not), at peak learning
    rate lr (None: TrainConfig's), forward_fast and te_split as
    jax_trainer's; a dict of plain values (with 'error' instead of the
    numbers when the run could not be made)."""
    from fp8kit.models.init import init_params
    train_cfg = train_config(batch, warmup, steps, lr)
    run = {"framework": framework, "recipe": recipe_name, "mode": mode}
    if inspect_every:
        run = {**run, "recipe": f"{recipe_name}/i{inspect_every}",
               "inspect_every": inspect_every}
    try:
        if framework == "torch":
            made = torch_trainer(model_cfg, train_cfg, recipe_name,
                                 init_params(model_cfg, train_cfg.seed), mode == "compile",
                                 float32_seams, inspect_every, forward_fast)
        else:
            made = jax_trainer(model_cfg, train_cfg, recipe_name,
                               init_params(model_cfg, train_cfg.seed), float32_seams,
                               inspect_every, forward_fast, te_split)
    except RuntimeError as e:
        return {**run, "error": str(e)}
    run["accumulation"] = bench_peers.accumulation(framework, recipe_name, forward_fast)
    trainer, reset_peak, peak = made
    if framework == "torch" and trainer.device.type == "cuda":
        import torch
        # The cuDNN this process loaded (a peer imported first can load its
        # own): bench_table flags runs whose versions or folders differ.
        run["cudnn"] = torch.backends.cudnn.version()
    compile_error = _compile_error() if mode == "compile" else ()   # (): catches nothing
    first_loss = None
    try:
        for _ in range(warmup):
            loss = trainer.train_step()   # a compiled run compiles in the first one
            first_loss = loss if first_loss is None else first_loss
    except compile_error as e:
        reason = next(iter(str(e).strip().splitlines()), "")[:200]
        return {**run, "error": f"torch.compile failed: {type(e).__name__}: {reason}"}
    reset_peak()
    # The timed steps run as a training loop that logs every `steps` steps:
    # the host does not wait for each step's loss, so it queues the next
    # step while the device runs this one; the clock stops once the last
    # loss is on the host.
    t0 = time.perf_counter()
    losses = trainer.train_steps(steps)
    seconds = time.perf_counter() - t0
    loss, first_loss = losses[-1], losses[0] if first_loss is None else first_loss
    result = {**run, "device": str(trainer.device),
              "tokens_per_s": batch * model_cfg.seq_len * steps / seconds,
              "step_ms": 1e3 * seconds / steps, "peak_memory_bytes": peak(), "last_loss": loss,
              "first_loss": first_loss, "diverged": diverged(loss, model_cfg, first_loss)}
    if "cudnn" in run:   # the folders only once the steps have loaded cuDNN's sub-libraries
        result["cudnn_folders"] = te_peer.loaded_cudnn_folders()
    if model_cfg.experts and trainer.aux_losses:
        result["routing_balance"] = sum(trainer.aux_losses) / len(trainer.aux_losses) / \
            model_cfg.layers
    return result


def _in_fresh_process(fn, *args):
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(fn, *args).result()


def _jax_backend() -> str:
    import jax
    return jax.default_backend()


def _on_cpu() -> bool:
    """Whether the runs will find no GPU: asked of PyTorch in this process,
    or where only JAX is installed of JAX in a fresh one (in this one it
    would hold GPU memory that the runs need)."""
    if importlib.util.find_spec("torch") is not None:
        import torch
        return not torch.cuda.is_available()
    return _in_fresh_process(_jax_backend) == "cpu"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fp8kit.models.bench",
                                description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    p.add_argument("--config", choices=sorted(CONFIGS), default="1b")
    p.add_argument("--layers", type=int, help="override the config's layer count")
    p.add_argument("--seq-len", type=int, help="override the config's sequence length")
    p.add_argument("--batch", type=int, default=1, help="sequences per step")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    p.add_argument("--steps", type=int, default=30, help="timed steps")
    p.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    p.add_argument("--recipes", default=",".join(RECIPES),
                   help=f"subset of {','.join(RECIPES + TE_RECIPES + TORCH_ONLY)}")
    p.add_argument("--compile", action="store_true",
                   help="also run each PyTorch recipe under torch.compile (torchao needs it)")
    p.add_argument("--compile-only", action="store_true",
                   help="run each PyTorch recipe under torch.compile only (implies --compile)")
    p.add_argument("--float32-seams", action="store_true",
                   help="fp8kit's fused layers read the float32 residual stream at their "
                        "seams, keeping SwiGLU's input in float32 for backward; costs memory "
                        "(default: bf16 seams, as the bf16 model's layers and TE's have)")
    p.add_argument("--forward-fast-accumulation", action="store_true",
                   help="fp8kit's delayed and current runs accumulate the forward GEMM "
                        "fast, as TE-PyTorch and torchao do (default: split, as every "
                        "fp8kit GEMM)")
    p.add_argument("--te-jax-split-accumulation", action="store_true",
                   help="TE-JAX's runs accumulate every GEMM split, as fp8kit does "
                        "(default: TE-JAX's own, fast)")
    p.add_argument("--inspect-every", type=int, default=0, metavar="N",
                   help="also run each fp8kit FP8 recipe (eager, jit) with its cast "
                        "statistics logged every N steps, to time inspection's cost")
    p.add_argument("--balanced-routing", action="store_true",
                   help="a mixture-of-experts config routes each token's top_k slots to "
                        "the experts round-robin (LlamaConfig.router_balanced): every "
                        "expert gets the same share, however the router trains")
    p.add_argument("--json", help="also write the results here (a directory: "
                                  "DIR/models_bench.json)")
    return p


def choices(text: str, allowed, flag: str) -> list[str]:
    """The comma-separated names of `text`; ValueError naming `flag` for
    an unknown one."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise ValueError(f"{flag}: unknown {bad}; choose from {', '.join(allowed)}")
    return names


def _checked(args):
    """(frameworks, recipes, LlamaConfig) from the arguments, the --json
    path resolved and checked writable; ValueError naming a bad argument or
    a missing package, before anything runs."""
    frameworks = choices(args.frameworks, FRAMEWORKS, "--frameworks")
    recipes = choices(args.recipes, RECIPES + TE_RECIPES + TORCH_ONLY, "--recipes")
    args.compile = args.compile or args.compile_only
    if TORCHAO in recipes and not args.compile:
        raise ValueError(f"--recipes {TORCHAO} runs compiled only (torchao's eager "
                         "Float8Linear is slower than bf16): add --compile")
    if args.compile and args.warmup < 1:
        raise ValueError(f"--warmup={args.warmup} with --compile would time the "
                         "compilation: use --warmup >= 1")
    overrides = {k: v for k, v in (("layers", args.layers), ("seq_len", args.seq_len))
                 if v is not None}
    if args.balanced_routing:
        if not CONFIGS[args.config].experts:
            raise ValueError(f"--balanced-routing: config {args.config} is dense (no "
                             "experts to route to); use it with a mixture-of-experts config")
        overrides["router_balanced"] = True
    model_cfg = dataclasses.replace(CONFIGS[args.config], **overrides)
    for name in ("batch", "warmup", "steps"):
        if getattr(args, name) < (0 if name == "warmup" else 1):
            raise ValueError(f"--{name}={getattr(args, name)} is too small")
    cli_support.check_seq_len(model_cfg.seq_len, evaluates=False)
    for fw in frameworks:
        cli_support.require(fw, fw, "the benchmark trains in it", "leave it out of --frameworks")
    if args.inspect_every < 0:
        raise ValueError(f"--inspect-every={args.inspect_every} must be >= 0 (0: no "
                         "inspected runs)")
    if args.inspect_every and args.warmup < 2:
        # JAX compiles the step with statistics at the first logged step and
        # without them at the first other one: both belong in the warm-up.
        raise ValueError(f"--warmup={args.warmup} with --inspect-every would time a "
                         "compilation: use --warmup >= 2")
    if args.forward_fast_accumulation and not {"delayed", "current"} & set(recipes):
        raise ValueError("--forward-fast-accumulation changes fp8kit's delayed and current "
                         "runs: add one of them to --recipes")
    if args.te_jax_split_accumulation and not (
            "jax" in frameworks and set(bench_peers.TE_JAX_RECIPES) & set(recipes)):
        raise ValueError("--te-jax-split-accumulation changes TE-JAX's runs: add jax to "
                         "--frameworks and te-delayed or te-current to --recipes")
    if args.json:
        args.json = cli_support.output_path(args.json, "models_bench.json")
        cli_support.writable_dir(args.json.parent, "--json")
    return frameworks, recipes, model_cfg


def _plan(frameworks, recipes, args) -> list[tuple]:
    """The (framework, recipe, mode, inspect_every) runs, in order: with
    --inspect-every, each fp8kit FP8 run that is not compiled is followed
    by the same run inspected."""
    runs = []
    for fw in frameworks:
        for recipe in recipes:
            # torchao and TE's block scaling are PyTorch's
            te_torch_only = recipe in TE_RECIPES and recipe not in bench_peers.TE_JAX_RECIPES
            if fw == "jax" and (recipe in TORCH_ONLY or te_torch_only):
                continue
            for mode in modes(fw, recipe, args.compile, args.compile_only):
                runs.append((fw, recipe, mode, 0))
                if args.inspect_every and recipe in RECIPES[1:] and mode != "compile":
                    runs.append((fw, recipe, mode, args.inspect_every))
    return runs


def _long_cpu_run(plan, model_cfg, args):
    """cli_support.long_cpu_run's warning for the planned runs (every step,
    warm-up included, trains)."""
    tokens = (args.warmup + args.steps) * args.batch * model_cfg.seq_len
    return cli_support.long_cpu_run(model_cfg, [(tokens, recipe != "bf16")
                                                for _, recipe, _, _ in plan])


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        frameworks, recipes, model_cfg = _checked(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    lr = peak_learning_rate(args.config)
    print(f"fp8kit.models.bench: config {args.config} ({model_cfg.num_params() / 1e9:.2f}B "
          f"parameters, {model_cfg.layers} layers, hidden {model_cfg.hidden}), batch "
          f"{args.batch} x seq {model_cfg.seq_len} = {args.batch * model_cfg.seq_len} "
          f"tokens/step, {args.warmup} warmup + {args.steps} timed steps at peak learning "
          f"rate {lr:g}; fp8kit's fused layers with {_seams_name(args.float32_seams)} seams",
          flush=True)
    plan = _plan(frameworks, recipes, args)
    on_cpu = _on_cpu()
    if on_cpu and (warning := _long_cpu_run(plan, model_cfg, args)):
        print(warning, file=sys.stderr, flush=True)
    rows = []
    for fw, recipe, mode, inspect_every in plan:
        label = f"{recipe}/i{inspect_every}" if inspect_every else recipe
        print(f"  {fw} {label} {mode} ...", end=" ", flush=True)
        rows.append(_in_fresh_process(measure, fw, model_cfg, recipe, mode, args.batch,
                                      args.warmup, args.steps, args.float32_seams,
                                      inspect_every, lr, args.forward_fast_accumulation,
                                      args.te_jax_split_accumulation))
        print(bench_table.summary(rows[-1]), flush=True)
        # After every run, so a run cut short by a time limit keeps what it measured.
        if args.json:
            _write_json(args.json, args.config, model_cfg, args.batch, args.float32_seams, lr,
                        rows)
    print(bench_table.table(rows))
    if on_cpu:
        print(CPU_NOTE)
    return 0


def _seams_name(float32_seams: bool) -> str:
    return "float32" if float32_seams else "bf16"


def _write_json(out: pathlib.Path, config: str, model_cfg, batch: int, float32_seams: bool,
                lr: float, rows) -> None:
    out.write_text(json.dumps({"config": config, "model": dataclasses.asdict(model_cfg),
                               "batch": batch, "fp8kit_seams": _seams_name(float32_seams),
                               "peak_lr": lr, "runs": rows}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
