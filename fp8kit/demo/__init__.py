"""fp8kit's demo: FP8 vs bf16 training in JAX and PyTorch, one command.

    python -m fp8kit.demo [--steps N] [--out out/demo_loss.png]

cli.py (arguments, the run), task.py (model sizes, weights, batches),
text.py (the generated training text), train_jax.py / train_torch.py
(the model and training loop per framework), report.py (table, samples,
PNG, JSON).
"""


def main(argv=None) -> int:
    from fp8kit.demo.cli import main as _main
    return _main(argv)
