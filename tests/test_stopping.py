"""The stopping rule (train.early_stopping) and the plateau schedule: a run whose validation RSUM is scripted stops
exactly where the rule, worked out by hand, says; the epoch cap is honoured; a run stopped mid-way resumes to the
same history, LR drops included."""

import math

import pytest
from conftest import history_rows

LR = 0.0002  # the schema default (config/methods/vsepp.yaml leaves it)


class ScriptedValidation:
    """Stands in for the trainer's ``validate``: RSUM of the n-th validated epoch = ``curve[n - 1]``;
    ``fail_at``: the call that raises instead (a kill before that epoch's checkpoint)."""

    def __init__(self, curve, fail_at=None):
        self.curve, self.fail_at, self.calls = list(curve), fail_at, 0

    def __call__(self, model, cfg, data, feats, device):
        self.calls += 1
        if self.calls == self.fail_at:
            self.fail_at, self.calls = None, self.calls - 1
            raise KeyboardInterrupt("killed")
        r = float(self.curve[self.calls - 1])
        one = {"r1": r / 6, "r5": r / 6, "r10": r / 6}
        return {"rsum": r, "i2t": dict(one), "t2i": dict(one)}, {"mean": 0.5, "std": 0.1, "margin": 0.2}


def run(tiny_synth, tmp_path, monkeypatch, name, curve, train_sections, schedule, fail_at=None):
    from xmr.run.config import load_run_config
    from xmr.train import trainer

    script = ScriptedValidation(curve, fail_at)
    monkeypatch.setattr(trainer, "validate", script)
    cfg = load_run_config(tiny_synth.recipe("vsepp", name=name, train={"batch_size": 16, **train_sections},
                                            optim={"schedule": schedule}))
    return cfg, script


def test_plateau_schedule_drops_the_lr_then_stops_at_the_next_plateau(tiny_synth, tmp_path, monkeypatch):
    from xmr.train.trainer import train

    # patience 2, min_delta 0, one LR drop. Best so far / bad epochs after each epoch:
    #   e1 10 (best 10) | e2 20 (20) | e3 30 (30) | e4 29: bad 1 | e5 30 (not > 30): bad 2 -> plateau 1: LR x0.1
    #   from epoch 6, bad reset | e6 40 (40) | e7 41 (41) | e8 40: bad 1 | e9 39: bad 2 -> plateau 2: stop.
    # => 9 epochs, best epoch 7, LR drop after epoch 5
    curve = [10, 20, 30, 29, 30, 40, 41, 40, 39, 50, 60, 70]
    es = {"early_stopping": {"enabled": True, "patience": 2, "max_epochs": 20}}
    cfg, script = run(tiny_synth, tmp_path, monkeypatch, "vsepp_plateau", curve, es,
                      {"name": "plateau", "gamma": 0.1, "plateau_drops": 1})
    out = train(cfg, tmp_path / "run", progress=False)
    assert script.calls == 9
    assert out["epochs_trained"] == 9 and len(out["history"]) == 9
    assert out["best_epoch"] == 7 and out["best_val_rsum"] == 41
    assert out["stopped_by"] == "plateau" and out["plateau_reached"] is True
    assert out["lr_drop_epochs"] == [5] and out["max_epochs"] == 20
    lrs = [r["lr"] for r in out["history"]]
    assert lrs[:5] == [pytest.approx(LR)] * 5 and lrs[5:] == [pytest.approx(LR * 0.1)] * 4
    assert out["val_similarity"] == {"mean": 0.5, "std": 0.1}


def test_warmup_epochs_are_not_counted_by_the_rule(tiny_synth, tmp_path, monkeypatch):
    from xmr.train.trainer import train

    # warmup_epochs 1, patience 2, no LR schedule: the warm-up's RSUM 50 is neither a best nor beaten.
    #   e1 50 (warm-up, skipped) | e2 20 (best 20) | e3 30 (30) | e4 25: bad 1 | e5 28: bad 2 -> stop after 5.
    # Counted from epoch 1 instead, e2 and e3 would be bad epochs and the run would stop after 3.
    # The best checkpoint is still the highest RSUM of any epoch (the reference code's choice): epoch 1.
    curve = [50, 20, 30, 25, 28, 40, 45]
    es = {"early_stopping": {"enabled": True, "patience": 2, "warmup_epochs": 1, "max_epochs": 10}}
    cfg, script = run(tiny_synth, tmp_path, monkeypatch, "vsepp_warm", curve, es, {"name": "none"})
    out = train(cfg, tmp_path / "run", progress=False)
    assert script.calls == 5 and out["epochs_trained"] == 5 and out["stopped_by"] == "plateau"
    assert out["best_epoch"] == 1


def test_min_delta_decides_what_counts_as_an_improvement(tiny_synth, tmp_path, monkeypatch):
    from xmr.train.trainer import train

    # no LR schedule, patience 2, min_delta 1.5: an epoch improves when RSUM > best + 1.5
    #   e1 10 (best 10) | e2 11 (<= 11.5): bad 1 | e3 12 (> 11.5): best 12 | e4 13 (<= 13.5): bad 1 | e5 13.2: bad 2
    #   -> stop after 5 epochs; the best checkpoint is still the highest RSUM, epoch 5 (13.2)
    curve = [10, 11, 12, 13, 13.2, 20, 30]
    es = {"early_stopping": {"enabled": True, "patience": 2, "min_delta": 1.5, "max_epochs": 10}}
    cfg, script = run(tiny_synth, tmp_path, monkeypatch, "vsepp_delta", curve, es, {"name": "none"})
    out = train(cfg, tmp_path / "run", progress=False)
    assert script.calls == 5 and out["epochs_trained"] == 5
    assert out["stopped_by"] == "plateau" and out["best_epoch"] == 5 and out["lr_drop_epochs"] == []
    assert [r["lr"] for r in out["history"]] == [pytest.approx(LR)] * 5


def test_the_cap_cuts_a_run_that_is_still_improving(tiny_synth, tmp_path, monkeypatch):
    from xmr.train.trainer import train

    # RSUM rises every epoch: the rule never fires; max_epochs 4 (not train.epochs 30) ends it
    es = {"epochs": 30, "early_stopping": {"enabled": True, "patience": 2, "max_epochs": 4}}
    cfg, script = run(tiny_synth, tmp_path, monkeypatch, "vsepp_cap", range(1, 31), es, {"name": "plateau"})
    out = train(cfg, tmp_path / "run", progress=False)
    assert script.calls == 4 and out["epochs_trained"] == 4 and out["best_epoch"] == 4
    assert out["stopped_by"] == "cap" and out["plateau_reached"] is False and out["lr_drop_epochs"] == []


def test_without_the_rule_the_run_trains_its_epochs(tiny_synth, tmp_path, monkeypatch):
    from xmr.train.trainer import train

    # default: early stopping off, step schedule: a falling curve does not stop the run
    cfg, script = run(tiny_synth, tmp_path, monkeypatch, "vsepp_off", [5, 4, 3], {"epochs": 3}, {"name": "step"})
    out = train(cfg, tmp_path / "run", progress=False)
    assert out["epochs_trained"] == 3 and out["stopped_by"] == "epochs" and out["best_epoch"] == 1


def test_a_killed_run_resumes_with_its_stopping_state(tiny_synth, tmp_path, monkeypatch):
    from xmr.core.io import load_checkpoint
    from xmr.train.trainer import train

    curve = [10, 20, 30, 29, 30, 40, 41, 40, 39, 50]
    es = {"early_stopping": {"enabled": True, "patience": 2, "max_epochs": 20}}
    sched = {"name": "plateau", "gamma": 0.1, "plateau_drops": 1}
    cfg, _ = run(tiny_synth, tmp_path, monkeypatch, "vsepp_stop_resume", curve, es, sched)
    straight = train(cfg, tmp_path / "straight", progress=False)
    # killed while validating epoch 7, after the LR drop of epoch 5: last.pt holds epoch 6 and the rule's state
    cfg, script = run(tiny_synth, tmp_path, monkeypatch, "vsepp_stop_resume", curve, es, sched, fail_at=7)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path / "killed", progress=False)
    ck = load_checkpoint(tmp_path / "killed" / "last.pt", "cpu")
    assert ck["epoch"] == 5 and ck["stopping"]["lr_drops"] == 1 and ck["stopping"]["best"] == 40
    resumed = train(cfg, tmp_path / "killed", progress=False)
    assert history_rows(tmp_path / "killed") == history_rows(tmp_path / "straight")
    assert {k: resumed[k] for k in ("epochs_trained", "best_epoch", "lr_drop_epochs", "stopped_by")} == \
        {"epochs_trained": 9, "best_epoch": 7, "lr_drop_epochs": [5], "stopped_by": "plateau"}
    assert straight["epochs_trained"] == 9
    # a finished (stopped) run started again trains nothing more
    again = train(cfg, tmp_path / "killed", progress=False)
    assert again["epochs_trained"] == 9 and not math.isinf(again["best_val_rsum"])


def test_the_rule_needs_validation_every_epoch(tiny_synth, tmp_path):
    from xmr.run.config import load_run_config
    from xmr.core.errors import XmrError
    from xmr.train.trainer import train

    cfg = load_run_config(tiny_synth.recipe("vsepp", name="vsepp_val2", train={
        "val_every": 2, "early_stopping": {"enabled": True}}))
    with pytest.raises(XmrError, match="train.val_every: 2"):
        train(cfg, tmp_path / "run", progress=False)
