"""The checkpoint files of a run directory and their keys, in one place: ``last.pt`` (written by the trainer every
epoch, read to resume) and ``best.pt`` (the weights every evaluation reads; written by the trainer at a best epoch,
rebuilt from ``last.pt`` after a kill, and written by ``xmr import-checkpoint`` for a published model).

Both hold tensors and plain data only, so they load with ``torch.load(weights_only=True)`` (:mod:`xmr.core.io`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from xmr.core.errors import XmrError
from xmr.core.io import load_checkpoint, save_checkpoint

LAST = "last.pt"
BEST = "best.pt"
#: what best.pt holds (a subset of last.pt's keys)
BEST_KEYS = ("model", "vocab_words", "image_dim", "epoch", "best_rsum")
#: what last.pt holds besides the trainer's state (:class:`xmr.train.trainer.TrainState`) and, while the last epoch
#: is not the best, ``best_model`` (the best weights, so that best.pt can be rebuilt after a kill)
LAST_KEYS = ("model", "optimizer", "vocab_words", "image_dim", "config_sha256", "inputs_sha256", "world_size")


def best_checkpoint(model_state: dict, vocab_words: list[str] | None, image_dim: int, epoch: int,
                    best_rsum: float) -> dict[str, Any]:
    """The contents of a best.pt (``epoch``: 0-based, as the trainer counts)."""
    return {"model": model_state, "vocab_words": vocab_words, "image_dim": image_dim, "epoch": epoch,
            "best_rsum": best_rsum}


def write_best(path: str | os.PathLike, model_state: dict, vocab_words: list[str] | None, image_dim: int,
               epoch: int, best_rsum: float) -> dict[str, Any]:
    """Write ``path`` (a run's best.pt, or a temporary one moved into place) atomically; returns what it holds."""
    best = best_checkpoint(model_state, vocab_words, image_dim, epoch, best_rsum)
    save_checkpoint(path, best)
    return best


def write_last(run_dir: str | os.PathLike, parts: dict[str, Any], state: dict[str, Any],
               best_model: dict | None) -> dict[str, Any]:
    """Write ``run_dir/last.pt``: ``parts`` (exactly :data:`LAST_KEYS`), the trainer's ``state`` and the best
    weights when they are not the current ones. Returns what it holds."""
    if set(parts) != set(LAST_KEYS):
        raise ValueError(f"last.pt parts {sorted(parts)} != {sorted(LAST_KEYS)}")
    ck = {**{k: parts[k] for k in LAST_KEYS}, **state}
    if best_model is not None:
        ck["best_model"] = best_model
    save_checkpoint(Path(run_dir) / LAST, ck)
    return ck


def best_from_last(ck: dict[str, Any], best_epoch: int, best_model: dict | None) -> dict[str, Any]:
    """The best.pt a last.pt stands for (``best_epoch``: 1-based): its own weights when the last epoch was the
    best, else the ``best_model`` it carries."""
    return best_checkpoint(best_model if best_model is not None else ck["model"], ck["vocab_words"],
                           ck["image_dim"], best_epoch - 1, ck["best_rsum"])


def read_last(run_dir: str | os.PathLike, device: Any = "cpu") -> dict[str, Any]:
    """``run_dir/last.pt`` for resuming; an unreadable one (cut short by a kill or a full disk) is a one-line
    error."""
    try:
        return load_checkpoint(Path(run_dir) / LAST, device)
    except XmrError as e:
        raise XmrError(f"{e}; cannot resume from it: rerun with --no-resume to start over, or delete it") from None
