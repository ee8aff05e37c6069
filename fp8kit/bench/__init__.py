"""fp8kit's benchmark suite: python -m fp8kit.bench (see cli.py; what
each row measures, the targets and the peers' reference numbers:
docs/benchmarks.md).

timing.py (how everything is timed), checks.py (output checks before
timing), results.py / targets.py (rows, ratios, targets),
progress.py, plots.py, meta.py; one module per section: gemm.py,
quantize.py, linear_torch.py, dense_jax.py, overhead.py.
"""


def main(argv=None) -> int:
    from fp8kit.bench.cli import main as _main
    return _main(argv)
