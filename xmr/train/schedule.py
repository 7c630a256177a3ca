"""Learning-rate schedule as a pure function of the (fractional) epoch: warm-up, then step or cosine decay, or
the ``plateau`` schedule's drops so far (decided by the stopping rule, xmr/train/stopping.py)."""

from __future__ import annotations

import math

from xmr.settings.run_settings import Schedule


def lr_factor(epoch: float, sched: Schedule, plateau_drops: int = 0) -> float:
    """Multiplier of the base learning rate at fractional ``epoch`` (0-based); ``plateau_drops``: the plateaus
    the run has met so far (the ``plateau`` schedule). Cosine decays over ``train.epochs``."""
    warm = sched.warmup_epochs
    if warm and epoch < warm:
        return (epoch + 1e-8) / warm
    if sched.name == "step":
        return sched.gamma ** sum(epoch >= s for s in sched.step_epochs)
    if sched.name == "plateau":
        return sched.gamma ** plateau_drops
    if sched.name == "cosine":
        t = (epoch - warm) / max(1e-8, sched.epochs - warm)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, t)))
    return 1.0
