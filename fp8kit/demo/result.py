"""One training run's outcome, the same for both frameworks."""

from __future__ import annotations

import dataclasses

import numpy as np

FINAL_WINDOW = 20   # steps averaged into the final training loss


@dataclasses.dataclass
class RunResult:
    framework: str                  # "jax" or "torch"
    precision: str                  # "FP8" or "bf16"
    device: str
    losses: list                    # training loss of every step
    val_loss: float                 # held-out loss after the last step
    tokens_per_s: float             # training throughput after the first step
    seconds: float                  # wall time of the whole run (compilation included)

    @property
    def label(self) -> str:
        return f"{self.framework} {self.precision}"

    def final_loss(self) -> float:
        """Mean training loss over the last FINAL_WINDOW steps (one step's loss is noisy)."""
        return float(np.mean(self.losses[-FINAL_WINDOW:]))

    def to_json(self) -> dict:
        return {"framework": self.framework, "precision": self.precision, "device": self.device,
                "losses": [float(v) for v in self.losses], "final_loss": self.final_loss(),
                "val_loss": float(self.val_loss), "tokens_per_s": float(self.tokens_per_s),
                "seconds": float(self.seconds)}
