"""Datasets: readers for the real formats (Karpathy JSON, CUB, precomputed layouts) and the synthetic set."""

from xmr.data.base import DATASET_READERS, CaptionedSplit, load_split

# Each import registers its reader(s).
from xmr.data import karpathy  # noqa: E402,F401

__all__ = ["DATASET_READERS", "CaptionedSplit", "load_split"]
