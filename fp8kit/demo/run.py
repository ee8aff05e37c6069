"""One demo run: a trainer from fp8kit.models trained for the configured
steps, a progress line every few steps, then the held-out loss."""

from __future__ import annotations

import math
import time

from fp8kit.demo.result import RunResult
from fp8kit.models import data
from fp8kit.models.schedule import learning_rate

EVAL_BATCHES = 4


def train(trainer_cls, model_cfg, train_cfg, recipe, params, device, label: str,
          log_every: int, layers, statistics=None) -> RunResult:
    """recipe None trains in bf16; layers: the trainer's FP8 layers (its
    framework's FP8Layers / JaxLayers); statistics: a StatsLog for the FP8
    casts' statistics (fp8kit.inspect), or None. Prints
    `[jax FP8   ] step 30/300 ...`."""
    t0 = time.perf_counter()
    trainer = trainer_cls(model_cfg, train_cfg, recipe, params=params, device=device,
                          layers=layers, statistics=statistics)
    tokens_per_step = train_cfg.batch * model_cfg.seq_len
    losses, t_first = [], None
    width = len(str(train_cfg.steps))
    for step in range(1, train_cfg.steps + 1):
        lr = learning_rate(trainer.step, train_cfg)
        losses.append(trainer.train_step())   # syncs: the progress line is live
        now = time.perf_counter()
        if step == 1:
            t_first = now                     # the first step compiles (JAX)
        if step == 1 or step % log_every == 0 or step == train_cfg.steps or \
                not math.isfinite(losses[-1]):
            rate = (f"{tokens_per_step * (step - 1) / (now - t_first):8.0f} tokens/s"
                    if step > 1 else " " * 15)
            print(f"  [{label:<10}] step {step:>{width}}/{train_cfg.steps}  loss "
                  f"{losses[-1]:7.4f}  lr {lr:.2e}  {rate}  {now - t0:6.1f} s", flush=True)
    steps_after_first = train_cfg.steps - 1
    tokens_per_s = (tokens_per_step * steps_after_first / (time.perf_counter() - t_first)
                    if steps_after_first else float("nan"))
    _, held_out = data.split(data.corpus())
    val_loss = trainer.evaluate(data.eval_batches(held_out, EVAL_BATCHES, train_cfg.batch,
                                                  model_cfg.seq_len))
    framework, precision = label.split()
    return RunResult(framework=framework, precision=precision, device=device_name(device),
                     losses=losses, val_loss=val_loss, tokens_per_s=tokens_per_s,
                     seconds=time.perf_counter() - t0)


def device_name(device) -> str:
    """"cpu", "gpu" (JAX) or PyTorch's device string ("cuda:0")."""
    return getattr(device, "platform", None) or str(device)
