"""fp8kit's demo: a Llama-style decoder trained in FP8 and in bf16, in JAX
and in PyTorch, one command.

    python -m fp8kit.demo [--steps N] [--out out/demo_loss.png]

cli.py (arguments, the four runs), run.py (one run: a trainer from
fp8kit.models, progress lines, the held-out loss), result.py (a run's
outcome), report.py (table, PNG, JSON).
"""


def main(argv=None) -> int:
    from fp8kit.demo.cli import main as _main
    return _main(argv)
