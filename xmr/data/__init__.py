"""Datasets: readers for the real formats (Karpathy JSON, caption tables in CSV/TSV, CUB, precomputed layouts) and
the synthetic set.

Each reader module registers itself in ``DATASET_READERS`` and is discovered automatically.
"""

from xmr.core.registry import import_submodules
from xmr.data.base import DATASET_READERS, CaptionedSplit, load_split

import_submodules("xmr.data")

__all__ = ["DATASET_READERS", "CaptionedSplit", "load_split"]
