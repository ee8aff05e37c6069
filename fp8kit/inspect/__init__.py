"""fp8kit.inspect: per-layer FP8 cast statistics of a training run, written
every N-th step and read back, plotted and summarised. Framework-free: no
torch or jax import; the PyTorch and JAX collectors hand it host numbers.

    records.py  TensorStats (one cast of one logged step), step_record,
                the JSON lines format, its encoding and read_run
    writer.py   StatsLog: the file, and TensorBoard scalars optionally
    history.py  the records regrouped per tensor, ranking, --tensors names
    summary.py  python -m fp8kit.inspect summary: the casts that lose most
    plot.py     python -m fp8kit.inspect plot: heat maps and amax histories
    cli.py      the command line

The file: one JSON object per line, one line per logged step:

    {"step": 100, "framework": "torch", "recipe": "DelayedScaling",
     "tensors": {"layers.0.mlp.fc1/input": {"amax": 3.5, "scale": 128.0,
                 "numel": 65536, "underflow": 12, "saturated": 0,
                 "underflow_rate": 0.000183, "saturation_rate": 0.0,
                 "relative_error": 0.021}, ...}}

A tensor is "layer/role", role one of ROLES (the FP8 GEMM operand: input,
weight, grad_output); `scale` is null under block scaling, relative_error
null when the tensor is all zeros. A non-finite number is the string
"nan", "inf" or "-inf" (JSON has no NaN), which read_run turns back into
a float. records.py says more. Use:

    with StatsLog("run.jsonl", every=100) as log:
        for step in range(steps):
            ...
            if log.should_log(step):
                log.write(step, "torch", "DelayedScaling", tensor_stats)

and `python -m fp8kit.inspect summary run.jsonl`, `... plot run.jsonl`
(docs/inspect.md).
"""

from fp8kit.inspect.history import History, histories
from fp8kit.inspect.plot import plot_run
from fp8kit.inspect.records import (METRICS, ROLES, TensorStats, decode_line, encode_line,
                                    read_run, step_record)
from fp8kit.inspect.summary import summary_text
from fp8kit.inspect.writer import StatsLog

__all__ = ["METRICS", "ROLES", "History", "StatsLog", "TensorStats", "decode_line",
           "encode_line", "histories", "plot_run", "read_run", "step_record", "summary_text"]
