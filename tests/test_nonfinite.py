"""A NaN/inf loss stops training with a one-line error naming the last good checkpoint, which stays intact."""

from __future__ import annotations

import math

import pytest
import torch

from xmr.config import load_run_config
from xmr.errors import XmrError
from xmr.methods import METHODS
from xmr.train.checkpoint import load_checkpoint
from xmr.train.trainer import train


def test_nan_in_epoch_two_stops_and_keeps_epoch_one(tiny_synth, tmp_path, monkeypatch):
    cls = METHODS.get("vsepp")
    real = cls.compute_loss

    def poisoned(self, img, txt, pos_mask, epoch):
        out = real(self, img, txt, pos_mask, epoch)
        if epoch >= 1:  # every step of the second epoch
            out["loss"] = out["loss"] * torch.tensor(math.nan)
        return out

    monkeypatch.setattr(cls, "compute_loss", poisoned)
    out = tmp_path / "run"
    cfg = load_run_config(tiny_synth.recipe("vsepp", name="vsepp_nan", train={"epochs": 3}))
    with pytest.raises(XmrError) as e:
        train(cfg, out, progress=False)
    assert str(e.value) == (f"non-finite loss (nan) at epoch 2 step 0; the last good checkpoint is {out / 'last.pt'}; "
                            f"lower optim.lr or enable optim.grad_clip")
    ck = load_checkpoint(out / "last.pt", "cpu")
    assert ck["epoch"] == 0 and len(ck["history"]) == 1  # epoch 1, untouched by the failed epoch
    assert all(torch.isfinite(v).all() for v in ck["model"].values() if v.is_floating_point())
    assert (out / "best.pt").exists()
