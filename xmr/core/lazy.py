"""``torch`` imported on first use, for the modules that must load without it.

The re-ranker registry (names, parameters, the files a re-ranker reads) is what Snakemake consults while it
plans, in every ``snakemake`` start and in every cluster job's own; importing torch there cost 2-3 s each. The
re-ranker modules touch torch only inside their functions, so they take this stand-in, which imports torch at
the first attribute looked up on it (``torch.cat``, ``torch.Tensor``) and then hands out torch's own objects.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any


class LazyModule:
    """A module imported on the first attribute access; the attributes are cached on the stand-in."""

    def __init__(self, name: str) -> None:
        self.__dict__["_name"] = name

    def __getattr__(self, attr: str) -> Any:
        value = getattr(importlib.import_module(self._name), attr)
        self.__dict__[attr] = value  # later look-ups are plain attribute reads
        return value

    def __repr__(self) -> str:
        return f"<lazily imported module {self._name!r}>"


if TYPE_CHECKING:  # type checkers see torch itself
    import torch
else:
    torch = LazyModule("torch")


def is_tensor(x: Any) -> bool:
    """True for a torch tensor, found without importing torch: nothing is one until torch has been imported."""
    t = sys.modules.get("torch")
    return t is not None and isinstance(x, t.Tensor)
