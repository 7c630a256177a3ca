"""One error type for every user-facing failure: the CLI prints it as one line and exits non-zero."""

from __future__ import annotations

import os
from pathlib import Path


class XmrError(Exception):
    """A problem with the user's input (config, file, argument); the message says what and how to fix it."""


def shown_path(path: str | os.PathLike) -> str:
    """A path as errors and notes print it, in one style: relative to the working folder when it lies inside it
    (``config/datasets/mine.yaml``, however xmr came to hold it), else as it is (``/data/coco``, ``../coco``)."""
    p = Path(path)
    if p.is_absolute():
        try:
            return str(p.relative_to(Path.cwd()))
        except ValueError:
            return str(p)
    return str(p)
