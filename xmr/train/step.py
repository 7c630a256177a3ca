"""One optimisation step of the trainer (:class:`TrainStep`, also what benchmarks/bench_train.py times), the module it
calls (:class:`TrainForward`) and the optimizer it steps (:func:`build_optimizer`); the loop around them, data,
checkpoints and validation, is :mod:`xmr.train.trainer`'s."""

from __future__ import annotations

import torch

from xmr.core.errors import XmrError
from xmr.inference.loaders import image_input
from xmr.inference.model import _to
from xmr.methods import RetrievalModel
from xmr.settings.run_settings import RunSettings
from xmr.train import distributed as dist
from xmr.train.samplers import CaptionTexts, positive_mask
from xmr.train.schedule import lr_factor


class TrainForward(torch.nn.Module):
    """What the trainer (and DistributedDataParallel) calls: the image backbone, if any, then the method's own
    ``forward`` on local features (methods that override ``forward`` train end to end unchanged).

    ``image_rows`` (``train.batch_by: image``): the image side holds each of the batch's images once and
    ``image_rows[p]`` is pair p's image among them. Each image is encoded once (one region drop, one set of
    BatchNorm statistics over the batch's images, as DivE's code) and its outputs are repeated for each of its
    captions, so the loss gets one row per pair as always. A method that defines its own ``forward`` (CODER: key
    encoders and queues) gets each pair's copy of its image's features instead."""

    def __init__(self, model: RetrievalModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, image_input: torch.Tensor, num_regions: torch.Tensor | None, text: dict,
                image_index: torch.Tensor, image_rows: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        feats, num_regions = self.model.image_local_features(image_input, num_regions)
        if image_rows is None:
            return self.model(feats, num_regions, text, image_index)
        if type(self.model).forward is not RetrievalModel.forward:
            return self.model(feats[image_rows], None if num_regions is None else num_regions[image_rows], text,
                              image_index)
        images = self.model.image_outputs(feats, num_regions)
        per_pair = {k: v[image_rows] if torch.is_tensor(v) else v for k, v in images.items()}
        return {**per_pair, **self.model.text_outputs(text)}


def build_optimizer(model: RetrievalModel, optim_cfg: dict, fused: bool = False) -> torch.optim.Optimizer:
    """``fused``: the update in fused kernels instead of the default foreach ones (what the trainer asks for on
    CUDA; the CPU keeps the default implementation, so CPU results do not move)."""
    groups = model.param_groups(optim_cfg["lr"], optim_cfg["text_backbone_lr_scale"])
    if getattr(model, "image_backbone", None) is not None:
        groups = model.with_image_backbone_group(groups, optim_cfg["lr"] * optim_cfg["image_backbone_lr_scale"])
    for g in groups:
        g["base_lr"] = g["lr"]
    name, wd = optim_cfg["name"], optim_cfg["weight_decay"]
    kw = {"fused": True} if fused else {}
    if optim_cfg["amsgrad"]:
        if name not in ("adam", "adamw"):
            raise XmrError(f"optim.amsgrad: true needs optim.name adam or adamw, not {name}")
        kw["amsgrad"] = True
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=optim_cfg["lr"], weight_decay=wd, **kw)
    if name == "adam":
        return torch.optim.Adam(groups, lr=optim_cfg["lr"], weight_decay=wd, **kw)
    return torch.optim.SGD(groups, lr=optim_cfg["lr"], momentum=optim_cfg["momentum"], weight_decay=wd)


class NonFiniteLoss(ArithmeticError):
    """The loss of a step was NaN or inf (the trainer turns it into a one-line error naming the checkpoint)."""


class TrainStep:
    """One optimisation step on one batch, exactly as :func:`train` runs it (also what benchmarks/bench_train.py
    times): lr schedule, forward under autocast, optional DDP gathering, positives, ``compute_loss``, backward,
    gradient clipping, optimizer and method hooks. Returns the loss terms (``loss`` and the method's named terms)."""

    def __init__(self, model: RetrievalModel, train_model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 scaler: torch.amp.GradScaler, settings: RunSettings, grad_clip: float, device: torch.device,
                 use_amp: bool = False, amp_dtype: torch.dtype = torch.float16, labels: torch.Tensor | None = None,
                 texts: CaptionTexts | None = None) -> None:
        self.model, self.train_model, self.optimizer, self.scaler = model, train_model, optimizer, scaler
        self.batching, self.schedule, self.image = settings.batching, settings.schedule, settings.image
        self.grad_clip = grad_clip  # optim.grad_clip
        self.device, self.use_amp, self.amp_dtype, self.labels = device, use_amp, amp_dtype, labels
        self.texts = texts  # the training split's caption texts, for train.positives: caption_text
        # a finiteness check reads the loss on the host: a device sync per step. The train loop turns it off on
        # CUDA and checks every host_sync_every(device) steps instead (and before any checkpoint).
        self.check_finite = True
        self.plateau_drops = 0  # the plateau schedule's LR drops so far (xmr/train/stopping.py)

    def __call__(self, batch: dict, epoch: int, it: int, steps_per_epoch: int) -> dict[str, torch.Tensor]:
        batching, sched, model, device = self.batching, self.schedule, self.model, self.device
        frac = epoch + it / max(1, steps_per_epoch)
        for g in self.optimizer.param_groups:
            g["lr"] = max(g["base_lr"] * lr_factor(frac, sched, self.plateau_drops), sched.min_lr)
        idx = batch["image_index"].to(device)
        cap = batch["caption_index"].to(device) if "caption_index" in batch else None
        x, nr = image_input(batch, device)
        rows = batch["image_rows"].to(device) if "image_rows" in batch else None  # train.batch_by: image
        with torch.autocast(device.type, dtype=self.amp_dtype, enabled=self.use_amp):  # covers the backbone too
            # idx: dataset image indices, for methods with memory banks (CODER)
            local = self.train_model(x, nr, _to(batch["text"], device), idx, rows)
            out = {**local, "img": local["img"].float(), "txt": local["txt"].float()}
            if batching.gather_negatives:  # one loss over the global batch (every process computes it)
                # every tensor of the forward's output has one row per pair: embeddings, and the residuals,
                # slots, masks the loss reads (DVSE, PVSE, DivE)
                out = {k: dist.gather_batch(v) if torch.is_tensor(v) else v for k, v in out.items()}
                idx = dist.gather_batch(idx)
                cap = None if cap is None else dist.gather_batch(cap)
            labels = None if self.labels is None else self.labels[idx]
            pos_mask = positive_mask(idx, labels, batching.positives, batching.mask_same_image, cap, self.texts)
            terms = model.compute_loss(out, pos_mask, frac)
        loss = terms["loss"]
        if self.check_finite and not torch.isfinite(loss):
            raise NonFiniteLoss(loss.item())
        self.optimizer.zero_grad(set_to_none=True)
        scale = self.image.loss_scale(epoch, it, steps_per_epoch)  # 1 unless unfreeze_loss_ramp
        self.scaler.scale(loss * scale if scale != 1.0 else loss).backward()
        if self.grad_clip:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), self.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        model.on_train_step_end(local)
        return terms
