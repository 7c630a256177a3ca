"""One stopping rule for every method: early stopping on validation RSUM, and the ``plateau`` learning-rate schedule
that is expressed relative to it.

A validated epoch *improves* when its RSUM exceeds the best RSUM so far by more than ``min_delta``; otherwise it
counts as a bad epoch. After ``patience`` bad epochs in a row the run is on a *plateau*:

- with ``optim.schedule.name: plateau`` and fewer than ``schedule.plateau_drops`` drops so far, the learning rate
  is multiplied by ``schedule.gamma`` from the next epoch on and the count of bad epochs starts again;
- otherwise, with ``train.early_stopping.enabled``, training stops (the plateau was reached).

So "drop the LR x0.1 once validation RSUM has not improved for ``patience`` epochs, then stop after the next
plateau" is ``schedule: {name: plateau, plateau_drops: 1}`` + ``early_stopping: {enabled: true}``. The cap on
epochs is ``early_stopping.max_epochs`` (null: ``train.epochs``). The state is plain data kept in last.pt, so a
resumed run takes the same decisions as an uninterrupted one.
"""

from __future__ import annotations

import math
from typing import Any

from xmr.core.errors import XmrError
from xmr.settings.run_settings import Schedule, Stopping, Validation


def initial_state() -> dict[str, Any]:
    """What the rule remembers between epochs (saved in last.pt)."""
    return {"best": -math.inf, "bad_epochs": 0, "lr_drops": 0, "lr_drop_epochs": [], "stopped": False}


def uses_rule(stop: Stopping, sched: Schedule) -> bool:
    return stop.enabled or sched.name == "plateau"


def check_settings(stop: Stopping, sched: Schedule, val: Validation, name: str) -> None:
    """The rule counts validated epochs: it needs validation every epoch."""
    if uses_rule(stop, sched) and val.every != 1:
        raise XmrError(f"{name}: train.val_every: {val.every} with early stopping or the plateau "
                       f"schedule; the rule counts epochs without improvement, so set train.val_every: 1")


def update(state: dict[str, Any], rsum: float, epoch: int, es: Stopping, sched: Schedule) -> str:
    """Apply the rule to the validation RSUM of (1-based) ``epoch``; ``state`` changes in place. Returns what
    happened: ``warmup`` (one of the first ``early_stopping.warmup_epochs``, not counted), ``improved``,
    ``wait``, ``lr_drop`` (the LR drops from the next epoch on) or ``stop``."""
    if epoch <= es.warmup_epochs:  # a loss warm-up's RSUM is not the method's: neither a best nor a bad epoch
        return "warmup"
    if rsum > state["best"] + es.min_delta:
        state["best"], state["bad_epochs"] = rsum, 0
        return "improved"
    state["bad_epochs"] += 1
    if state["bad_epochs"] < es.patience:
        return "wait"
    if sched.name == "plateau" and state["lr_drops"] < sched.plateau_drops:
        state["lr_drops"] += 1
        state["lr_drop_epochs"] = [*state["lr_drop_epochs"], epoch]
        state["bad_epochs"] = 0
        return "lr_drop"
    if es.enabled:
        state["stopped"] = True
        return "stop"
    return "wait"


def summary(state: dict[str, Any], epochs_trained: int, es: Stopping) -> dict[str, Any]:
    """What train.json records about the rule: the epochs trained, the LR drops and how the run ended
    (``plateau``: stopped by the rule; ``cap``: the rule was on but the epoch cap came first; ``epochs``: no rule,
    the fixed number of epochs)."""
    ended = "plateau" if state["stopped"] else ("cap" if es.enabled else "epochs")
    return {"epochs_trained": epochs_trained, "max_epochs": es.cap, "stopped_by": ended,
            "plateau_reached": bool(state["stopped"]), "lr_drop_epochs": list(state["lr_drop_epochs"]),
            "early_stopping": {f: getattr(es, f) for f in Stopping.KEYS}}  # its fields are the section's keys
