"""Learning-rate schedule as a pure function of the (fractional) epoch: warm-up, then step or cosine decay, or
the ``plateau`` schedule's drops so far (decided by the stopping rule, xmr/train/stopping.py)."""

from __future__ import annotations

import math


def lr_factor(epoch: float, total_epochs: int, sched: dict, plateau_drops: int = 0) -> float:
    """Multiplier of the base learning rate at fractional ``epoch`` (0-based); ``plateau_drops``: the plateaus
    the run has met so far (the ``plateau`` schedule)."""
    warm = sched.get("warmup_epochs", 0)
    if warm and epoch < warm:
        return (epoch + 1e-8) / warm
    name = sched.get("name", "step")
    if name == "step":
        return sched.get("gamma", 0.1) ** sum(epoch >= s for s in sched.get("step_epochs", []))
    if name == "plateau":
        return sched.get("gamma", 0.1) ** plateau_drops
    if name == "cosine":
        t = (epoch - warm) / max(1e-8, total_epochs - warm)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, t)))
    return 1.0
