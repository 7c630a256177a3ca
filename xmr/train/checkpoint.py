"""Checkpoints hold tensors and plain data only, so they load with ``torch.load(weights_only=True)``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from xmr.errors import XmrError
from xmr.io import atomic_path


def save_checkpoint(path: str | os.PathLike, state: dict[str, Any]) -> None:
    with atomic_path(path, ".pt") as tmp:
        torch.save(state, tmp)


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise XmrError(f"{path}: checkpoint not found; train the run first (`xmr train`)")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling problem is a bad file for the user
        raise XmrError(f"{path}: cannot load checkpoint ({type(e).__name__}: {str(e).splitlines()[0]})") from None
