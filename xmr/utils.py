"""Small shared helpers: device choice, seeding."""

from __future__ import annotations

import os
import random

import numpy as np
import torch


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` -> the local CUDA device when there is one (LOCAL_RANK under torchrun), else CPU."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        return torch.device("cpu")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
