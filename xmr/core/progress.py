"""Progress for logs without a terminal: what a tqdm bar shows, as plain ``key=value`` lines on stderr.

``--no-progress`` (what the workflow passes) removes only the bar; jobs under Snakemake or SLURM still write one
line per epoch (trainer), one every N steps on long epochs, and a throughput line when extraction or scoring ends,
so a 48-hour job's log says what it is doing. docs/tracking.md, "Logs".
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Iterable, Iterator


# rates, durations and RSUMs (sums of percentages): one decimal; other numbers (losses): 4 decimals below 100
ONE_DECIMAL = ("_per_s", "seconds", "rsum")


def fmt(key: str, value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.1f}" if key.endswith(ONE_DECIMAL) or abs(value) >= 100 else f"{value:.4f}"
    return str(value)


def log_line(head: str, **fields: Any) -> str:
    """Print ``head key=value ...`` to stderr (flushed at once: logs are files) and return it."""
    line = " ".join([head, *(f"{k}={fmt(k, v)}" for k, v in fields.items() if v is not None)])
    print(line, file=sys.stderr, flush=True)
    return line


def parse_line(line: str) -> dict[str, str]:
    """The ``key=value`` fields of a line written by :func:`log_line`."""
    return dict(part.split("=", 1) for part in line.split() if "=" in part)


def eta(seconds_done: float, done: int, total: int) -> str:
    left = max(0.0, seconds_done / max(1, done) * (total - done))
    h, rest = divmod(int(left), 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}"


class LineLog:
    """A stand-in for a disabled tqdm bar (``update``/``set_postfix``/``close``, iterable): a line every
    ``every`` updates (0: none) and a throughput line at ``close``, unless ``silent`` (library calls)."""

    def __init__(self, iterable: Iterable | None = None, desc: str = "", total: int | None = None,
                 unit: str = "it", initial: int = 0, every: int = 0, silent: bool = False) -> None:
        self.iterable, self.desc, self.total, self.unit, self.every = iterable, desc, total, unit, every
        self.n, self.start_n, self.t0, self.calls, self.silent = initial, initial, time.time(), 0, silent

    def __iter__(self) -> Iterator:
        for item in self.iterable or ():
            yield item
            self.update(1)

    def update(self, n: int = 1) -> None:
        self.n += n
        self.calls += 1
        if self.every and self.calls % self.every == 0 and not self.silent:
            dt = time.time() - self.t0
            done = self.n - self.start_n
            log_line(self.desc, done=f"{self.n}/{self.total or '?'}", **{f"{self.unit}_per_s": done / max(dt, 1e-9)},
                     eta=eta(dt, done, self.total - self.start_n) if self.total else None)

    def set_postfix(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        if self.silent:
            return
        dt = time.time() - self.t0
        done = self.n - self.start_n
        log_line(self.desc, done=f"{self.n}/{self.total or self.n}", seconds=dt,
                 **{f"{self.unit}_per_s": done / max(dt, 1e-9)})


def bar(iterable: Iterable | None = None, *, desc: str, total: int | None = None, unit: str = "it",
        progress: bool | None = True, initial: int = 0, every: int = 0):
    """A tqdm bar when ``progress``, else a :class:`LineLog` (same calls): its lines when False, none when None
    (a library call such as ``Model.encode_image``, whose caller did not ask for a log)."""
    if progress:
        from tqdm import tqdm

        return tqdm(iterable, desc=desc, total=total, unit=unit, initial=initial)
    return LineLog(iterable, desc=desc, total=total, unit=unit, initial=initial, every=every,
                   silent=progress is None)


class _Tee:
    """A text stream that writes to ``stream`` (the console) and appends the same text to ``log``; anything else
    (``fileno``, ``isatty``, ``encoding``) is the console's, so child processes inherit the console."""

    def __init__(self, stream: Any, log: Any) -> None:
        self._stream, self._log = stream, log

    def write(self, text: str) -> int:
        self._log.write(text)
        return self._stream.write(text)

    def flush(self) -> None:
        self._log.flush()
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def append_output_to(path: str | os.PathLike) -> None:
    """From here on, append what this process prints (``sys.stdout``, ``sys.stderr``, its one-line error included)
    to ``path`` as well, line by line, until it exits; the console still shows it. The job log of a training
    (``xmr train --log``): a training resumed after Ctrl-C or a kill, or retried, writes below what the earlier
    attempts wrote, where the trainer's ``==== resuming ... ====`` line separates them."""
    from pathlib import Path

    from xmr.core.errors import XmrError

    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        log = open(path, "a", buffering=1, encoding="utf-8", errors="replace")  # noqa: SIM115 - open until exit
    except OSError as e:
        raise XmrError(f"{path}: cannot append the log there ({e.strerror or e}); choose another --log") from None
    sys.stdout, sys.stderr = _Tee(sys.stdout, log), _Tee(sys.stderr, log)
