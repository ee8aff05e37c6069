"""The training text, its tokenizer and the batches, shared by both
frameworks' training loops.

Corpus: the source of a fixed list of pure-Python modules of the running
interpreter's standard library (documentation-rich English prose in
docstrings and comments mixed with code). It ships with every CPython
installation, so nothing is downloaded and nothing large is committed
here, and it has enough structure that a small byte-level model learns
visibly within a few hundred steps. The text differs slightly between
Python versions; within one installation it is fixed.

Tokenizer: bytes. Token i is byte i (vocab 256): no vocabulary file, no
unknown tokens, and any text round-trips.

Batches: `batch` windows of seq_len + 1 tokens (inputs and next-token
targets) at offsets drawn from a NumPy Generator seeded once. The sampler's
state (batches drawn, the generator's state) is part of a checkpoint, so a
resumed run sees exactly the batches the uninterrupted run would have.
"""

from __future__ import annotations

import functools
import pathlib
import sysconfig

import numpy as np

VOCAB = 256
# Relative to the standard library directory; chosen for their prose.
CORPUS_FILES = (
    "argparse.py", "textwrap.py", "difflib.py", "inspect.py", "dataclasses.py",
    "functools.py", "collections/__init__.py", "pathlib.py", "subprocess.py", "threading.py",
    "unittest/case.py", "json/decoder.py", "json/encoder.py", "logging/__init__.py",
    "random.py", "statistics.py", "fractions.py", "typing.py", "string.py", "heapq.py",
)
VAL_FRACTION = 0.05   # the corpus' last 5% is held out


def encode(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)


def decode(tokens) -> str:
    return bytes(np.asarray(tokens, np.uint8).tolist()).decode("utf-8", errors="replace")


@functools.lru_cache(maxsize=1)
def corpus() -> np.ndarray:
    """All of CORPUS_FILES as one int32 token array (read once per process)."""
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    parts = []
    for rel in CORPUS_FILES:
        path = stdlib / rel
        try:
            parts.append(path.read_bytes())
        except OSError as e:
            raise RuntimeError(
                f"fp8kit.models.data: cannot read the standard-library file {path} ({e}); the "
                "training corpus is Python's own library source. An installation without "
                "its .py sources (some embedded builds) cannot run fp8kit's model "
                "training.") from None
    tokens = np.frombuffer(b"\n\n".join(parts), np.uint8).astype(np.int32)
    tokens.flags.writeable = False
    return tokens


def split(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(training tokens, held-out tokens)."""
    cut = int(len(tokens) * (1 - VAL_FRACTION))
    return tokens[:cut], tokens[cut:]


class BatchSampler:
    """Deterministic batches int32 [batch, seq_len + 1] of random windows."""

    def __init__(self, tokens: np.ndarray, batch: int, seq_len: int, seed: int):
        if batch < 1 or seq_len < 1:
            raise ValueError(f"BatchSampler: batch={batch} and seq_len={seq_len} must be >= 1")
        if len(tokens) < seq_len + 1:
            raise ValueError(f"BatchSampler: {len(tokens)} tokens cannot fill a window of "
                             f"seq_len + 1 = {seq_len + 1}")
        self.tokens, self.batch, self.seq_len = tokens, batch, seq_len
        self.rng = np.random.default_rng(seed)
        self.position = 0   # batches drawn so far

    def next(self) -> np.ndarray:
        starts = self.rng.integers(0, len(self.tokens) - self.seq_len, size=self.batch)
        self.position += 1
        return self.tokens[starts[:, None] + np.arange(self.seq_len + 1)]

    def state_dict(self) -> dict:
        """Plain values only (loads with torch.load(weights_only=True) and JSON)."""
        return {"position": self.position, "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        try:
            position, rng_state = int(state["position"]), state["rng"]
            self.rng.bit_generator.state = rng_state
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"BatchSampler.load_state_dict: not a sampler state ({e!r}); "
                             "expected {'position': int, 'rng': a NumPy bit generator "
                             "state}") from None
        self.position = position


def eval_batches(tokens: np.ndarray, count: int, batch: int, seq_len: int,
                 seed: int = 12345) -> list[np.ndarray]:
    """A fixed list of held-out batches (the same for every run and resume)."""
    sampler = BatchSampler(tokens, batch, seq_len, seed)
    return [sampler.next() for _ in range(count)]
