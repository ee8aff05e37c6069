"""What the command lines check and set before they start work:
python -m fp8kit.demo and python -m fp8kit.models.bench (which train the
decoder) and python -m fp8kit.bench. A bad argument, an unwritable output
or a missing package ends them at once with one line (the checks raise
ValueError, which the caller prints as `error: ...`), not after minutes of
training with a traceback; a CPU run that would take hours says so first.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import tempfile

# Training throughput on the CPU in FLOP/s (train_flops per second),
# measured on one core of a 2-core x86 machine with PyTorch pinned to one
# thread (pin_torch_threads), for the decoder from hidden 128 to 1024:
# fp8kit's FP8 reference kernels 2.0-3.6 GFLOP/s, bf16 35-80 GFLOP/s in
# PyTorch and JAX. The low ends, so that an estimate errs long.
CPU_FLOPS_PER_S = {"FP8": 2e9, "bf16": 35e9}
# CPU runs estimated to take longer are warned about; the demo's default
# (the tiny config) is estimated at about 9 minutes.
LONG_CPU_RUN_S = 30 * 60


def require(module: str, extra: str, why: str, instead: str = "") -> None:
    """ValueError naming the package and the pip command that installs it
    when `module` is not installed; `instead`: a way to run without it."""
    if importlib.util.find_spec(module) is None:
        raise ValueError(f"{module} is not installed ({why}): pip install 'fp8kit[{extra}]'"
                         + (f", or {instead}" if instead else ""))


def output_path(text: str, default_name: str) -> pathlib.Path:
    """The file an output argument names: default_name inside `text` when
    that is an existing directory or ends in a separator, `text` with
    default_name's suffix when it has none, else `text` as given."""
    path = pathlib.Path(text)
    if text.endswith(("/", os.sep)) or path.is_dir():
        return path / default_name
    if not path.suffix:
        return path.with_suffix(pathlib.Path(default_name).suffix)
    return path


def writable_dir(directory: pathlib.Path, flag: str) -> None:
    """Creates `directory` (with its parents) and writes a scratch file in
    it; ValueError naming `flag` when either fails. Done before any work, so
    that an unwritable output cannot discard a finished run."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except FileExistsError:
        raise ValueError(f"{flag}: {directory} exists and is not a directory") from None
    except OSError as e:
        raise ValueError(f"{flag}: cannot write to {directory}: {e.strerror or e}") from None


def check_seq_len(seq_len: int, evaluates: bool) -> None:
    """ValueError when the training text (or, for a run that evaluates, the
    shorter held-out text) cannot fill one window of seq_len + 1 tokens;
    the sampler would only find out after training."""
    from fp8kit.models import data
    train, held_out = data.split(data.corpus())
    text, name = (held_out, "held-out") if evaluates else (train, "training")
    if seq_len + 1 > len(text):
        raise ValueError(f"--seq-len {seq_len}: the {name} text has {len(text)} tokens and a "
                         f"sequence needs seq_len + 1 of them: at most {len(text) - 1}")


def pin_torch_threads(device) -> None:
    """One PyTorch thread when `device` is the CPU: the decoder's matrices
    are small and fp8kit's CPU kernels single-threaded, and on a 2-core
    machine shared with other work PyTorch's thread pool spin-waits (bf16
    steps 40x slower, benchmark ratios that swing from run to run)."""
    import torch
    if torch.device(device).type == "cpu":
        torch.set_num_threads(1)


def train_flops(model_cfg, tokens: int) -> float:
    """FLOPs of training on `tokens` tokens: 6 per parameter and token
    (forward 2, backward 4) plus attention's score and value products,
    12 x hidden x seq_len per layer and token."""
    per_token = 6 * model_cfg.num_params() + 12 * model_cfg.layers * model_cfg.hidden * \
        model_cfg.seq_len
    return float(tokens) * per_token


def long_cpu_run(model_cfg, runs) -> str | None:
    """A one-line warning when training runs on the CPU (`runs`: one
    (tokens, is_fp8) per run) are estimated to take longer than
    LONG_CPU_RUN_S; None when they are not."""
    flops = {True: 0.0, False: 0.0}
    for tokens, is_fp8 in runs:
        flops[is_fp8] += train_flops(model_cfg, tokens)
    seconds = flops[True] / CPU_FLOPS_PER_S["FP8"] + flops[False] / CPU_FLOPS_PER_S["bf16"]
    if seconds <= LONG_CPU_RUN_S:
        return None
    return (f"warning: {len(runs)} training run(s) of a {model_cfg.num_params() / 1e6:.3g}M-"
            f"parameter model on the CPU: about {_duration(seconds)} by an estimate (not a "
            f"measurement: {sum(flops.values()):.1e} FLOPs at {CPU_FLOPS_PER_S['FP8'] / 1e9:g} "
            f"GFLOP/s in FP8, fp8kit's CPU reference kernels, and "
            f"{CPU_FLOPS_PER_S['bf16'] / 1e9:g} in bf16): a run this size is meant for a GPU")


def _duration(seconds: float) -> str:
    for unit, size in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} seconds"
