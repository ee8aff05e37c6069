"""The GPU's SM clock and board power while benchmarks run, from nvidia-smi.

A GPU running FP8 GEMMs back to back can reach its software power cap and
lower its SM clock well below its boost clock (docs/benchmarks.md has an
H200's numbers; scripts/power_cap.py measures it), so a large layer's
speed, and its ratio to bf16, depend on how long it has been running. Rows that time
sustained work record what the GPU was doing alongside the time.

GpuSampler runs `nvidia-smi --query-gpu=clocks.sm,power.draw -lms N` in the
background and stamps each sample with time.monotonic() as it arrives;
mean_over(windows) averages the samples inside the given time windows.
nvidia-smi's power.draw is itself averaged over a short window, so
windows much shorter than a second say little.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from typing import Iterable, List, Optional, Tuple


class GpuSampler:
    """Context manager sampling one GPU's SM clock (MHz) and power (W)."""

    def __init__(self, index: int = 0, period_ms: int = 50):
        self._cmd = ["nvidia-smi", f"--id={index}", "--query-gpu=clocks.sm,power.draw",
                     "--format=csv,noheader,nounits", f"-lms={period_ms}"]
        self._samples: List[Tuple[float, float, float]] = []  # (monotonic s, MHz, W)
        self._proc: Optional[subprocess.Popen] = None
        self._reader: Optional[threading.Thread] = None

    @staticmethod
    def available() -> bool:
        return shutil.which("nvidia-smi") is not None

    def __enter__(self) -> "GpuSampler":
        self._proc = subprocess.Popen(self._cmd, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        for line in self._proc.stdout:
            parts = line.split(",")
            try:
                mhz, watts = float(parts[0]), float(parts[1])
            except (IndexError, ValueError):
                continue  # "[N/A]" or a message: not a sample
            self._samples.append((time.monotonic(), mhz, watts))

    def __exit__(self, *exc) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join(timeout=5)

    def mean_over(self, windows: Iterable[Tuple[float, float]]) -> Optional[dict]:
        """{"sm_mhz", "power_w", "samples"} averaged over the samples taken
        inside any of the (start, end) monotonic-time windows; None if no
        sample fell inside."""
        windows = list(windows)
        inside = [(mhz, w) for t, mhz, w in self._samples
                  if any(start <= t <= end for start, end in windows)]
        if not inside:
            return None
        return {"sm_mhz": round(sum(m for m, _ in inside) / len(inside)),
                "power_w": round(sum(w for _, w in inside) / len(inside)),
                "samples": len(inside)}
