"""One training run's outcome, the same for both frameworks."""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import numpy as np


@dataclasses.dataclass
class RunResult:
    framework: str                  # "jax" or "torch"
    precision: str                  # "fp8" or "bf16"
    device: str
    losses: list                    # training loss of every step
    val_loss: float                 # held-out loss after the last step
    seconds: float                  # wall time of the whole run (compilation included)
    # ctx int32 [B, context] -> logits [B, vocab] of the trained model (for samples).
    logits_fn: Optional[Callable[[np.ndarray], np.ndarray]] = None

    @property
    def label(self) -> str:
        return f"{self.framework} {self.precision}"

    def final_loss(self, window: int = 20) -> float:
        """Mean training loss over the last `window` steps (one step's loss is noisy)."""
        tail = self.losses[-min(window, len(self.losses)):]
        return float(np.mean(tail))

    def to_json(self) -> dict:
        return {"framework": self.framework, "precision": self.precision, "device": self.device,
                "losses": [float(v) for v in self.losses], "final_loss": self.final_loss(),
                "val_loss": float(self.val_loss), "seconds": float(self.seconds)}
