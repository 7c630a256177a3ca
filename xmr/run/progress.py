"""``progress.json``: where a training is, written by the trainer from its first step (atomically, every few
seconds and at each epoch's end), so that ``xmr show RUN_DIR`` says how a run goes before its first epoch ends
(``history.csv`` has a row per finished epoch only; ``train.json`` comes at the end)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from xmr.core.errors import XmrError
from xmr.core.io import atomic_path, read_json

PROGRESS = "progress.json"

#: seconds between two writes within an epoch
EVERY_S = 5.0


class ProgressRecord:
    """The trainer's writer of ``run_dir/progress.json`` (main process): :meth:`step` writes at most every
    :data:`EVERY_S` seconds, :meth:`write` at once."""

    def __init__(self, run_dir: str | os.PathLike, enabled: bool = True) -> None:
        self.path = Path(run_dir) / PROGRESS
        self.enabled = enabled
        self.last = 0.0

    def write(self, epoch: int, max_epochs: int, step: int, steps: int, loss: float | None) -> None:
        """Epoch ``epoch`` (1-based) of ``max_epochs``, ``step`` of its ``steps`` done, the epoch's mean loss so far."""
        if not self.enabled:
            return
        record = {"epoch": epoch, "max_epochs": max_epochs, "step": step, "steps_per_epoch": steps,
                  "loss_so_far": loss, "written_at": time.time()}
        try:
            with atomic_path(self.path, ".json", fault=False) as tmp:
                tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        except (OSError, XmrError):  # best effort: a full disk stops the training at its next checkpoint instead
            pass
        self.last = time.monotonic()

    def due(self) -> bool:
        return self.enabled and time.monotonic() - self.last >= EVERY_S


def read_progress(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The run's ``progress.json``, or None where it has none (a run written before it existed, an import)."""
    path = Path(run_dir) / PROGRESS
    return read_json(path) if path.is_file() else None


def progress_text(p: dict[str, Any]) -> str:
    """``epoch 1 of 6, step 120 of 500, loss so far 0.4123`` (the loss: the epoch's mean over its steps so far)."""
    loss = f", loss so far {p['loss_so_far']:.4f}" if p.get("loss_so_far") is not None else ""
    return f"epoch {p['epoch']} of {p['max_epochs']}, step {p['step']} of {p['steps_per_epoch']}{loss}"
