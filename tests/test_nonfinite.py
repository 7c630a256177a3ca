"""A NaN/inf loss stops training with a one-line error naming the last good checkpoint, which stays intact."""

from __future__ import annotations

import math

import pytest
import torch

from xmr.run.config import load_run_config
from xmr.core.errors import XmrError
from xmr.methods import METHODS
from xmr.core.io import load_checkpoint
from xmr.train.trainer import train


def test_nan_in_epoch_two_stops_and_keeps_epoch_one(tiny_synth, tmp_path, monkeypatch):
    cls = METHODS.get("vsepp")
    real = cls.compute_loss

    def poisoned(self, fwd, positives, epoch):
        out = real(self, fwd, positives, epoch)
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


@pytest.mark.parametrize("bad_step,reported", [(8, "8-9"), (14, "14-14")])
def test_deferred_check_on_a_device_that_reads_the_loss_every_few_steps(tiny_synth, tmp_path, monkeypatch,
                                                                         bad_step, reported):
    """On CUDA the loss is read on the host every host_sync_every steps (a read per step stalls the GPU). One
    non-finite step is still reported, with the range of steps read together, and before any checkpoint of the
    weights it touched. 48 images x 5 captions / batch 16 = 15 steps an epoch; read every 2 steps: steps 8-9 are
    read at step 9, and step 14, the last, at the end of the epoch."""
    import xmr.train.trainer as trainer

    cls = METHODS.get("vsepp")
    real = cls.compute_loss

    def poisoned(self, fwd, positives, epoch):  # ``epoch`` is epoch + step / steps_per_epoch
        out = real(self, fwd, positives, epoch)
        if round((epoch - 1) * 15) == bad_step:  # that one step of epoch 2
            out["loss"] = out["loss"] * torch.tensor(math.inf)
        return out

    monkeypatch.setattr(cls, "compute_loss", poisoned)
    monkeypatch.setattr(trainer, "host_sync_every", lambda device: 2)
    out = tmp_path / "run"
    cfg = load_run_config(tiny_synth.recipe("vsepp", name="vsepp_inf", train={"epochs": 3, "batch_size": 16}))
    with pytest.raises(XmrError) as e:
        train(cfg, out, progress=False)
    assert str(e.value) == (f"non-finite loss at epoch 2, one of steps {reported} (read every 2 steps on this "
                            f"device); the last good checkpoint is {out / 'last.pt'}; lower optim.lr or enable "
                            f"optim.grad_clip")
    ck = load_checkpoint(out / "last.pt", "cpu")
    assert ck["epoch"] == 0 and all(torch.isfinite(v).all() for v in ck["model"].values() if v.is_floating_point())


def test_fused_adamw_takes_the_same_steps_as_the_default_one():
    """The trainer asks for the fused AdamW on CUDA; it must be the same update rule (checked on the CPU, where
    torch has it too): three steps from the same weights and gradients agree to float32 rounding."""
    from xmr.train.step import build_optimizer

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(4, 3)

        def param_groups(self, lr, scale):
            return [{"params": list(self.parameters()), "lr": lr}]

    ocfg = {"name": "adamw", "lr": 0.01, "weight_decay": 0.1, "text_backbone_lr_scale": 1.0, "momentum": 0.9,
            "amsgrad": False}
    models = []
    for fused in (False, True):
        torch.manual_seed(0)
        m = Tiny()
        opt = build_optimizer(m, ocfg, fused=fused)
        assert opt.defaults["fused"] is (True if fused else None)
        g = torch.Generator().manual_seed(1)
        for _ in range(3):
            opt.zero_grad()
            m.w(torch.randn(5, 4, generator=g)).pow(2).sum().backward()
            opt.step()
        models.append(m)
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
