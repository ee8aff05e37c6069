"""What the demo shows at the end: the table of final losses and
throughput, the loss-curve PNG and a JSON file with every loss."""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import textwrap

import numpy as np

from fp8kit.demo.result import FINAL_WINDOW, RunResult

UNIFORM_GUESS = math.log(256)   # nats per byte of a model that knows nothing
TITLE_CHARS_PER_COLUMN = 70     # of the plot's title, per 6.5-inch column at the default font


def _bf16_twin(results: list[RunResult], r: RunResult):
    return next((o for o in results if o.framework == r.framework and o.precision == "bf16"),
                None)


def table(results: list[RunResult]) -> str:
    header = (f"{'run':<10} {'device':<6} | {'train loss':>10} {'held-out':>8} "
              f"{'vs bf16':>7} | {'tokens/s':>8} {'time':>7}")
    lines = [f"Final losses (cross-entropy, nats/byte; uniform guess {UNIFORM_GUESS:.3f}): train "
             f"= mean of the last {FINAL_WINDOW} steps, held-out = text never trained on, vs "
             "bf16 = held-out minus the bf16 run's. tokens/s = training throughput after the "
             "first step (which compiles); time = the whole run.",
             header, "-" * len(header)]
    for r in results:
        twin = _bf16_twin(results, r)
        diff = (f"{r.val_loss - twin.val_loss:+7.4f}" if twin is not None and twin is not r
                else f"{'':>7}")
        lines.append(f"{r.label:<10} {r.device:<6} | {r.final_loss():10.4f} {r.val_loss:8.4f} "
                     f"{diff} | {r.tokens_per_s:8.0f} {r.seconds:6.1f}s")
    return "\n".join(lines)


def smooth(v: np.ndarray, window: int) -> np.ndarray:
    """Running mean over the last `window` steps (fewer at the start)."""
    c = np.cumsum(np.insert(np.asarray(v, np.float64), 0, 0.0))
    idx = np.arange(1, len(v) + 1)
    lo = np.maximum(0, idx - window)
    return (c[idx] - c[lo]) / (idx - lo)


def plot(results: list[RunResult], model_cfg, train_cfg, recipe_name: str,
         path: pathlib.Path) -> None:
    """One column per framework. Top: training loss, FP8 solid and bf16
    dashed (smoothed, bold), each step's raw loss faint. Bottom: FP8 minus
    bf16, smoothed (the curves above usually overlap)."""
    import matplotlib
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    frameworks = list(dict.fromkeys(r.framework for r in results))
    fig, axes = plt.subplots(2, len(frameworks), figsize=(6.5 * len(frameworks), 7),
                             squeeze=False, sharex="col", layout="constrained",
                             gridspec_kw={"height_ratios": [3, 1.2]})
    window = max(1, train_cfg.steps // 30)
    style = {"FP8": ("tab:red", "-"), "bf16": ("tab:blue", "--")}
    for col, fw in enumerate(frameworks):
        ax, ax_diff = axes[0][col], axes[1][col]
        runs = {r.precision: r for r in results if r.framework == fw}
        for precision in ("FP8", "bf16"):   # bf16 dashed on top: both visible where they overlap
            r = runs.get(precision)
            if r is None:
                continue
            color, line = style[precision]
            steps = np.arange(1, len(r.losses) + 1)
            ax.plot(steps, r.losses, color=color, alpha=0.15, linewidth=0.8,
                    label=f"{precision}, per step")
            ax.plot(steps, smooth(r.losses, window), color=color, linestyle=line,
                    linewidth=1.8,
                    label=f"{precision}, {window}-step mean (held-out {r.val_loss:.3f})")
        ax.axhline(UNIFORM_GUESS, color="gray", linestyle=":", linewidth=1,
                   label="uniform guess")
        ax.set_title(f"{'JAX' if fw == 'jax' else 'PyTorch'} on {next(iter(runs.values())).device}")
        ax.set_ylabel("training loss (nats/byte)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        if "FP8" in runs and "bf16" in runs:
            diff = np.asarray(runs["FP8"].losses) - np.asarray(runs["bf16"].losses)
            ax_diff.plot(np.arange(1, len(diff) + 1), smooth(diff, window), color="tab:purple",
                         label=f"{window}-step mean")
            ax_diff.legend(fontsize="small")
        ax_diff.axhline(0.0, color="gray", linewidth=0.8)
        ax_diff.set_ylabel("FP8 - bf16 loss")
        ax_diff.set_xlabel("step")
        ax_diff.grid(alpha=0.3)
    tokens = train_cfg.batch * model_cfg.seq_len
    title = (
        f"fp8kit demo: Llama-style decoder ({model_cfg.layers} layers, hidden {model_cfg.hidden}, "
        f"{model_cfg.heads} heads) on bytes of Python source; batch {train_cfg.batch} x "
        f"seq {model_cfg.seq_len} = {tokens} tokens/step. FP8 = fp8kit ({recipe_name}) on "
        f"the q, k, v, o, gate, up, down projections; bold curves: {window}-step running "
        "mean, faint: per-step loss")
    # Wrapped to the figure's width (a one-column plot cut it at both edges).
    fig.suptitle(textwrap.fill(title, width=TITLE_CHARS_PER_COLUMN * len(frameworks)))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_json(results: list[RunResult], model_cfg, train_cfg, recipe_name: str,
               path: pathlib.Path) -> None:
    doc = {"model": dataclasses.asdict(model_cfg), "train": dataclasses.asdict(train_cfg),
           "recipe": recipe_name, "uniform_guess_loss": UNIFORM_GUESS,
           "runs": [r.to_json() for r in results]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))
