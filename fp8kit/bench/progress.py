"""The suite's progress bar: tqdm when it is installed, else a plain one
(a redrawn line on a terminal, one line per step in a log file)."""

from __future__ import annotations

import sys
import time


class _Plain:
    def __init__(self, total: int, desc: str, stream):
        self.total, self.n, self.desc, self.stream = total, 0, desc, stream
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.t0 = time.perf_counter()

    def _draw(self, what: str) -> None:
        width = 24
        filled = int(width * self.n / max(1, self.total))
        line = (f"{self.desc} [{'#' * filled}{'.' * (width - filled)}] {self.n}/{self.total} "
                f"{time.perf_counter() - self.t0:5.0f}s {what}")
        if self.tty:
            self.stream.write("\r" + line[:150].ljust(150))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def set_description(self, what: str) -> None:
        self._draw(what)

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.tty or self.n >= self.total:  # a log gets one line per step, plus the end
            self._draw("done" if self.n >= self.total else "")

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


class _Tqdm:
    def __init__(self, total: int, desc: str, stream):
        from tqdm import tqdm
        self.bar = tqdm(total=total, desc=desc, file=stream, dynamic_ncols=True)

    def set_description(self, what: str) -> None:
        self.bar.set_postfix_str(what)

    def update(self, n: int = 1) -> None:
        self.bar.update(n)

    def close(self) -> None:
        self.bar.close()


def bar(total: int, desc: str = "fp8kit.bench", stream=None, plain: bool = False):
    """A progress bar with set_description(what), update(n) and close()."""
    stream = stream or sys.stderr
    if not plain:
        try:
            return _Tqdm(total, desc, stream)
        except ImportError:
            pass
    return _Plain(total, desc, stream)
