"""The one trainer: every method, CPU or GPU, single process or DDP (torchrun / srun), resumable.

Its parts, in the order :func:`train` runs them: :func:`set_up` (data, model, optimizer, :class:`TrainStep`),
:func:`resume_state` (a :class:`TrainState` from last.pt, or a fresh one), :func:`start_epochs`, then per epoch
:func:`run_epoch` (the steps) and :func:`end_epoch` (validation, best epoch, stopping rule, checkpoints). The files
``last.pt``/``best.pt`` and their keys belong to :mod:`xmr.run.checkpoint_files`.

``train(cfg, out_dir)`` writes into ``out_dir``: ``config.yaml`` (resolved config), ``last.pt`` (every
epoch), ``best.pt`` (best validation RSUM), ``history.csv`` (per-epoch loss and validation metrics) and
``train.json`` (summary incl. the MLflow run id); ``progress.json`` (:mod:`xmr.run.progress`) says where it is
from the first step on. A killed run started again continues from ``last.pt`` (when
its config and its inputs, the training split's :class:`xmr.run.inputs.RunInputs`, are those ``last.pt`` was
written with); per-epoch reseeding makes the resumed run identical to an uninterrupted one on CPU. ``last.pt``
also holds the best weights (``best_model``, when the last epoch was not the best), so a resumed run rebuilds a
``best.pt`` lost to a kill or deleted by Snakemake. The fault suite's kill points are ``xmr.core.io.fault_point`` calls.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
import yaml
from torch.utils.data import DataLoader

from xmr.run import checkpoint_files
from xmr.core.errors import XmrError
from xmr.evaluation import evaluate_sims
from xmr.evaluation.spread import similarity_spread
from xmr.inference.model import build_model, encode_split
from xmr.core.io import (atomic_path, check_writable_dir, fault_point, load_checkpoint, remove_stale_temps,
                         save_checkpoint, write_json)
from xmr.inference.loaders import PairCollate, PairDataset, load_split_images
from xmr.methods import METHODS, RetrievalModel
from xmr.core.progress import eta, log_line
from xmr.core.reproducibility import use_deterministic_algorithms
from xmr.run.inputs import RunInputs
from xmr.run.lock import process_run_lock
from xmr.run.progress import PROGRESS, ProgressRecord
from xmr.settings.run_settings import Batching, RunSettings, TextInput, run_settings
from xmr.run.tracking import Tracker, git_commit, metrics_to_flat
from xmr.train import distributed as dist
from xmr.train import stopping
from xmr.train.samplers import (ImageBatchSampler, ImageIndexedCollate, ImageIndexedPairs,
                                 OnePerClassBatchSampler, caption_texts, check_batching)
from xmr.train.step import NonFiniteLoss, TrainForward, TrainStep, build_optimizer
from xmr.core.cpus import available_cpus
from xmr.core.utils import resolve_device, seed_everything, tune_cpu_allocator


def _cpu_copy(state: dict) -> dict:
    """A CPU copy of a state dict; non-tensor entries (a module's extra state, e.g. CODER's) are copied as they are."""
    import copy

    return {k: v.detach().to("cpu", copy=True) if torch.is_tensor(v) else copy.deepcopy(v) for k, v in state.items()}


def build_vocab_words(text: TextInput, train_split) -> list[str] | None:
    if text.encoder != "bigru":
        return None
    from xmr.text.vocab import Vocabulary, nltk_tokenize

    tokens = train_split.tokens
    if text.tokenizer == "nltk":  # the words the encoder will see (its collate tokenizes the same way)
        tokens = [nltk_tokenize(c) for c in train_split.captions]
    return Vocabulary.build(tokens, text.min_word_count).words


def inputs_digest(settings: RunSettings, model: RetrievalModel) -> tuple[str, dict[str, str]]:
    """Hash of what the run reads besides its config (:class:`xmr.run.inputs.RunInputs` of the training split:
    features or, end to end, the backbone weights; precomputed text features; annotations), so that a run never
    resumes onto inputs that changed since last.pt was written (Snakemake reruns a training when its inputs change,
    and last.pt is not one of the outputs it deletes). Also returns the parts, for the run's tags."""
    weights = model.image_backbone.net.weights_sha256 if settings.image.end_to_end else None
    return RunInputs.of(settings, "train").digest(weights)


def config_digest(cfg: dict) -> str:
    """Hash of everything that defines the run except bookkeeping (so a changed recipe never resumes)."""
    keep = {k: v for k, v in cfg.items() if k not in ("tracking", "description")}
    bookkeeping = ("workers", "log_every", "log_every_steps", "threads", "fill_uninitialized_memory")
    keep["train"] = {k: v for k, v in cfg["train"].items() if k not in bookkeeping}
    return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()


def host_sync_every(device: torch.device) -> int:
    """Steps between reads of the loss on the host (finiteness, progress bar). On the CPU every step costs
    nothing extra; on CUDA each read stalls the queue of kernels, so it is done every 25 steps."""
    return 25 if device.type == "cuda" else 1


def validate(model: RetrievalModel, settings: RunSettings, data, feats, device) -> tuple[dict, dict[str, float]]:
    """Validation metrics and the spread of the validation similarity matrix (its mean and std are what a
    re-ranker standardises with; xmr/evaluation/spread.py)."""
    img, cap = encode_split(model, settings.image, data, feats, device, settings.validation.batch_size,
                            settings.batching.workers, settings.validation.max_images)
    sims = model.similarity_matrix(img.to(device), cap.to(device)).cpu()
    c = settings.dataset_config["captions_per_image"]
    return evaluate_sims(sims, protocol="plain", captions_per_image=c), similarity_spread(sims, c)


def _batch_sampler(batching: Batching, seed: int, data, epoch: int,
                   ctx) -> OnePerClassBatchSampler | ImageBatchSampler:
    """The epoch's batch sampler (``train.batch_by: image`` or ``train.sampler: one_per_class``)."""
    cls, groups = ((ImageBatchSampler, data.caption_image) if batching.batch_by == "image"
                   else (OnePerClassBatchSampler, data.caption_labels))
    return cls(groups, batching.batch_size, seed=seed * 7919 + epoch, rank=ctx.rank, world_size=ctx.world_size)


def _batched_by_sampler(batching: Batching) -> bool:
    return batching.batch_by == "image" or batching.sampler != "random"


def _write_history(path: Path, rows: list[dict]) -> None:
    keys = sorted({k for r in rows for k in r}, key=lambda k: (k != "epoch", k))
    with atomic_path(path, ".csv") as tmp:
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(rows)


def _check_finite(nonfinite: torch.Tensor, epoch: int, first: int, it: int, last: Path, every: int) -> None:
    """The deferred check (CUDA): one of steps ``first``..``it`` of ``epoch`` had a non-finite loss."""
    if nonfinite.item():
        raise XmrError(f"non-finite loss at epoch {epoch + 1}, one of steps {first}-{it} (read every {every} steps "
                       f"on this device); the last good checkpoint is "
                       f"{last if last.exists() else 'none (first epoch)'}; lower optim.lr or enable optim.grad_clip")


# -- the trainer's parts: its state, set-up, resume, one epoch, the end of an epoch ----------------------------------

@dataclass
class TrainState:
    """Everything a run remembers between epochs, saved in ``last.pt`` (as flat keys, :meth:`saved`) and restored
    from it as one object (:meth:`from_checkpoint`).

    The random state is not stored: every epoch reseeds from ``train.seed`` and its number (:meth:`reseed`), so a
    resumed run draws what an uninterrupted one draws."""

    epoch: int = -1  # the last finished epoch, 0-based (-1: none yet)
    best_rsum: float = -math.inf
    best_epoch: int = -1  # 1-based (-1: none yet)
    history: list[dict] = field(default_factory=list)  # history.csv's rows
    run_id: str | None = None  # the MLflow run a resumed training continues
    step: int = 0
    stopping: dict = field(default_factory=stopping.initial_state)  # xmr/train/stopping.py
    best_val_similarity: dict | None = None  # mean and std of the best epoch's validation matrix
    best_model: dict | None = None  # CPU copy of the best weights while the current epoch is not the best

    def saved(self) -> dict[str, Any]:
        """The state's keys of last.pt (``best_model`` is written beside them only when set)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "best_model"}

    @classmethod
    def from_checkpoint(cls, ck: dict[str, Any]) -> TrainState:
        """The state a last.pt was written with (keys an older last.pt lacks keep their initial values)."""
        state = cls()
        for f in fields(cls):
            if f.name != "best_model":
                setattr(state, f.name, ck.get(f.name, getattr(state, f.name)))
        if ck.get("best_model") is not None:  # kept on the CPU, as while training
            state.best_model = _cpu_copy(ck["best_model"])
        return state

    @staticmethod
    def reseed(seed: int, epoch: int) -> None:
        """The random state of ``epoch``: a function of the seed and the epoch only (resume == uninterrupted)."""
        torch.manual_seed(seed * 100003 + epoch)


@dataclass
class TrainRun:
    """What set-up builds once and every epoch uses: ``cfg`` (the run config: config.yaml, its digest, MLflow's
    params and tags) stays in this module; the parts below take ``settings``."""

    cfg: dict
    settings: RunSettings
    out: Path
    ctx: Any  # xmr.train.distributed.DistContext
    device: torch.device
    e2e: bool
    max_epochs: int
    train_data: Any
    train_feats: Any
    val_data: Any
    val_feats: Any
    vocab_words: list[str] | None
    model: RetrievalModel
    image_dim: int
    optimizer: torch.optim.Optimizer
    stepper: TrainStep
    config_sha: str = ""
    inputs_sha: str = ""
    input_parts: dict = field(default_factory=dict)
    train_model: torch.nn.Module | None = None  # the model as DDP sees it (set after resume)
    dataset: Any = None
    steps_per_epoch: int = 0
    sync_every: int = 1
    progress: ProgressRecord | None = None  # progress.json: where training is, for `xmr show` (main process)

    @property
    def last(self) -> Path:
        return self.out / checkpoint_files.LAST


def prepare_process(settings: RunSettings, out: Path, ctx) -> torch.device:
    """Checks that need no data, this process's device, threads and seeds."""
    proc = settings.process
    device = resolve_device(proc.device) if not ctx.enabled else ctx.device
    if ctx.is_main:  # before loading data and models: a read-only or missing disk fails in one line, at once
        check_writable_dir(out, "training output directory (--out-dir)")
        for name in ("config.yaml", checkpoint_files.LAST, checkpoint_files.BEST, "history.csv", "train.json", PROGRESS):
            remove_stale_temps(out / name)  # a kill inside an atomic write leaves its temporary file
    if device.type == "cpu":
        tune_cpu_allocator()  # avoids re-faulting activations every step (see xmr.core.utils)
    torch.set_num_threads(training_threads(proc.threads))
    if settings.image.end_to_end:
        settings.image.preparation  # noqa: B018 - decided and checked now, before any data is read
    stopping.check_settings(settings.stopping, settings.schedule, settings.validation, settings.name)
    seed_everything(proc.seed)
    if proc.deterministic:
        use_deterministic_algorithms(warn_only=True, fill_uninitialized_memory=proc.fill_uninitialized_memory)
    return device


def training_threads(asked: int | None) -> int:
    """torch's CPU threads for a training: ``asked`` (``xmr train --threads``, the cores Snakemake gives the job, or
    ``train.threads``), else torch's default (``$OMP_NUM_THREADS``, else one per core), never more than the CPUs
    this process may run on (a SLURM allocation, a ``taskset``): more threads than cores oversubscribe them. One
    inter-op thread: a training runs one operator at a time."""
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # set already, or inter-op work has run in this process (an in-process test)
        pass
    return max(1, min(asked or torch.get_num_threads(), available_cpus()))


def set_up(cfg: dict, out: Path, ctx) -> TrainRun:
    """Data, model, optimizer and step of a run (before any resume). The run config is read here, into the typed
    settings every part below takes (:func:`xmr.settings.run_settings.run_settings`, the method's ``settings_of``)."""
    settings = run_settings(cfg)
    method = METHODS.get(settings.method).settings_of(cfg, settings.text)
    device = prepare_process(settings, out, ctx)
    image, batching, dataset_cfg = settings.image, settings.batching, settings.dataset_config
    e2e = image.end_to_end
    train_data, train_feats = load_split_images(image, dataset_cfg, "train", train=True)
    check_batching(batching, train_data, settings.name, settings.dataset)
    if batching.gather_negatives and not METHODS.get(settings.method).gathered_loss:
        raise XmrError(f"{settings.name}: train.gather_negatives: method {settings.method} keeps per-batch state for "
                       f"its loss (momentum queues filled from the local batch), which is not gathered across "
                       f"processes; set it false (docs/pipeline.md)")
    labels = None if train_data.image_labels is None else torch.as_tensor(train_data.image_labels).to(device)
    texts = caption_texts(train_data).to(device) if batching.positives == "caption_text" else None
    val_data, val_feats = load_split_images(image, dataset_cfg, dataset_cfg["val_split"])
    vocab_words = build_vocab_words(settings.text, train_data)
    model = build_model(method, image, None if e2e else train_feats.feature_dim, vocab_words).to(device)
    model.prepare(train_data)  # data-dependent state (CODER's concepts); a resumed checkpoint overwrites it
    optimizer = build_optimizer(model, cfg["optim"], fused=device.type == "cuda")
    use_amp = settings.process.amp and device.type == "cuda"
    amp_dtype = torch.bfloat16 if use_amp and torch.cuda.is_bf16_supported() else torch.float16
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp and amp_dtype == torch.float16)
    stepper = TrainStep(model, None, optimizer, scaler, settings, cfg["optim"]["grad_clip"], device, use_amp,
                        amp_dtype, labels, texts)
    run = TrainRun(cfg, settings, out, ctx, device, e2e, settings.stopping.cap, train_data, train_feats, val_data,
                   val_feats, vocab_words, model, model.image_backbone.feature_dim if e2e else train_feats.feature_dim,
                   optimizer, stepper)
    run.config_sha = config_digest(cfg)
    run.inputs_sha, run.input_parts = ctx.from_main(lambda: inputs_digest(settings, model))  # one store read
    return run


def resume_state(run: TrainRun, resume: bool) -> tuple[TrainState, bool]:
    """The state to continue from: last.pt's when it was written with this config and these inputs, else a fresh
    one (and whether the run resumed). Rebuilds a best.pt lost to a kill from last.pt."""
    ctx, last = run.ctx, run.last
    written = checkpoint_files.read_last(run.out, "cpu") if resume and last.exists() else None
    if written is None:
        return TrainState(), resume
    why = ("a different config" if written.get("config_sha256") != run.config_sha
           else "other input files (training features, text features, backbone weights or annotations)"
           if written.get("inputs_sha256") != run.inputs_sha else None)
    if why:
        if ctx.is_main:  # always said: a restart must be visible in logs (a section line: the workflow appends)
            print(f"==== {last} was trained with {why}: starting over ====", flush=True)
        return TrainState(), False
    ck = written if run.device.type == "cpu" else checkpoint_files.read_last(run.out, run.device)
    run.model.load_state_dict(ck["model"])
    run.optimizer.load_state_dict(ck["optimizer"])
    state = TrainState.from_checkpoint(ck)
    written_by, bs = ck.get("world_size", ctx.world_size), run.settings.batching.batch_size
    if written_by != ctx.world_size and ctx.is_main:  # allowed, but the global batch is not what it was
        print(f"note: resuming with {ctx.world_size} process(es); {last} was written by {written_by}, so the "
              f"global batch changes from {bs * written_by} to {bs * ctx.world_size} (train.batch_size is per "
              f"process)", flush=True)
    if ctx.is_main:  # always said: a resumed run must be visible in logs, below its first epochs (the workflow appends)
        print(f"==== resuming {run.out} after epoch {state.epoch + 1} ====", flush=True)
        best = run.out / checkpoint_files.BEST
        if state.best_epoch > 0 and not best.exists():
            # a kill between last.pt and best.pt, or Snakemake deleting best.pt as an incomplete output:
            # last.pt carries the best weights (its own when the last epoch was the best)
            save_checkpoint(best, checkpoint_files.best_from_last(ck, state.best_epoch, state.best_model))
            print(f"restored {best} (epoch {state.best_epoch}) from {last}", flush=True)
    return state, True


def start_epochs(run: TrainRun, state: TrainState) -> None:
    """After resume: the model as DDP runs it, config.yaml, the pair dataset and the epoch length."""
    cfg, ctx = run.cfg, run.ctx
    run.train_model = ctx.wrap(TrainForward(run.model))
    run.stepper.train_model = run.train_model
    if ctx.is_main:
        run.out.mkdir(parents=True, exist_ok=True)
        with atomic_path(run.out / "config.yaml", ".yaml") as tmp:
            tmp.write_text(yaml.safe_dump(cfg, sort_keys=False))
    settings = run.settings
    batching = settings.batching
    pairs = ImageIndexedPairs if batching.batch_by == "image" else PairDataset
    run.dataset = pairs(run.train_data, run.train_feats, settings.image.max_regions)
    bs = batching.batch_size
    run.steps_per_epoch = len(_batch_sampler(batching, settings.process.seed, run.train_data, 0, ctx)) \
        if _batched_by_sampler(batching) else math.ceil(len(run.dataset) / (bs * ctx.world_size))
    run.sync_every = host_sync_every(run.device)
    run.stepper.check_finite = run.sync_every == 1
    run.stepper.plateau_drops = state.stopping["lr_drops"]
    run.progress = ProgressRecord(run.out, ctx.is_main)
    if state.epoch + 1 < run.max_epochs:  # from the first step on, `xmr show` has the run's config and where it is
        run.progress.write(state.epoch + 2, run.max_epochs, 0, run.steps_per_epoch, None)


def run_tags(run: TrainRun) -> dict[str, Any]:
    """The MLflow tags of a training."""
    cfg = run.cfg
    tags = {
        "method": cfg["method"], "dataset": cfg["dataset"], "recipe": cfg["name"],
        "backbone": cfg["features"]["backbone"], "text_encoder": cfg["text"]["encoder"],
        "git_commit": git_commit(), "device": str(run.device), "world_size": run.ctx.world_size,
        "image_source": "images" if run.e2e else "precomputed",
    }
    tags.update(run.train_data.extra.get("run_tags", {}))  # e.g. CUB's split_rule (which split files were used)
    tags.update({k: v[:16] for k, v in run.input_parts.items() if not k.startswith("annotations")})
    return tags


def epoch_loader(run: TrainRun, epoch: int) -> DataLoader:
    """The training pairs of ``epoch`` (its order a function of the seed and the epoch)."""
    ctx, device = run.ctx, run.device
    batching, seed = run.settings.batching, run.settings.process.seed
    collate = (ImageIndexedCollate if batching.batch_by == "image" else PairCollate)(run.model.text.collate, "train")
    if _batched_by_sampler(batching):
        return DataLoader(run.dataset, batch_sampler=_batch_sampler(batching, seed, run.train_data, epoch, ctx),
                          num_workers=batching.workers, collate_fn=collate, pin_memory=device.type == "cuda")
    bs = batching.batch_size
    sampler = ctx.sampler(run.dataset, seed=seed + epoch)
    gen = torch.Generator().manual_seed(seed * 7919 + epoch)
    return DataLoader(run.dataset, batch_size=bs, shuffle=sampler is None, sampler=sampler, generator=gen,
                      num_workers=batching.workers, collate_fn=collate, drop_last=len(run.dataset) > bs,
                      pin_memory=device.type == "cuda")


def set_backbone_phase(run: TrainRun, epoch: int, first_epoch: int, progress: bool) -> None:
    """End to end: the image backbone frozen or trained in ``epoch`` (``image_backbone.frozen_epochs``)."""
    image = run.settings.image
    frozen = image.backbone_frozen(epoch)
    run.model.image_backbone.set_frozen(frozen)
    if progress and run.ctx.is_main and epoch in (first_epoch, image.frozen_epochs):
        print(f"epoch {epoch + 1}: image backbone {'frozen' if frozen else 'trained'}", flush=True)


def run_epoch(run: TrainRun, state: TrainState, epoch: int, tracker: Tracker, progress: bool) -> dict[str, Any]:
    """One pass over the training pairs; returns the epoch's history row (loss, speed, learning rate)."""
    from tqdm import tqdm

    ctx, device, last, log = run.ctx, run.device, run.last, run.settings.logging
    TrainState.reseed(run.settings.process.seed, epoch)
    loader = epoch_loader(run, epoch)
    if run.e2e:
        set_backbone_phase(run, epoch, state.epoch + 1, progress)
    run.train_model.train()
    t0, seen, nb, checked, sync_every, steps = time.time(), 0, 0, 0, run.sync_every, run.steps_per_epoch
    # on the device: no sync per step (float64 where the device has it: MPS does not)
    loss_sum = torch.zeros((), dtype=torch.float32 if device.type == "mps" else torch.float64, device=device)
    nonfinite = torch.zeros((), dtype=torch.bool, device=device)
    term_sums: dict[str, torch.Tensor] = {}  # the loss's named terms (ADOPT's K, ...): their epoch means in history
    bar = tqdm(loader, desc=f"epoch {epoch + 1}/{run.max_epochs}", unit="batch",
               disable=not (progress and ctx.is_main), total=steps)
    for it, batch in enumerate(bar):
        fault_point("step")
        try:
            terms = run.stepper(batch, epoch, it, steps)
        except NonFiniteLoss as e:
            raise XmrError(f"non-finite loss ({e}) at epoch {epoch + 1} step {it}; the last good checkpoint "
                           f"is {last if last.exists() else 'none (first epoch)'}; lower optim.lr or enable "
                           f"optim.grad_clip") from None
        loss = terms["loss"].detach()
        for name, value in terms.items():
            if name != "loss" and torch.is_tensor(value) and value.numel() == 1:
                term_sums[name] = term_sums.get(name, 0) + value.detach().to(device=device, dtype=loss_sum.dtype)
        state.step += 1
        seen += len(batch["image_index"]) * ctx.world_size
        loss_sum += loss
        nb += 1
        if run.progress.due():
            run.progress.write(epoch + 1, run.max_epochs, it + 1, steps, loss_sum.item() / nb)
        if sync_every > 1:
            nonfinite |= ~torch.isfinite(loss)
            if (it + 1) % sync_every == 0:
                _check_finite(nonfinite, epoch, checked, it, last, sync_every)
                checked = it + 1
        if (it + 1) % sync_every == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}", samples_s=f"{seen / (time.time() - t0):.0f}")
        every = log.every_steps
        if not progress and ctx.is_main and every and (it + 1) % every == 0:
            dt = time.time() - t0  # long epochs without a bar: where it is, how fast, how long to go
            log_line(f"epoch {epoch + 1}/{run.max_epochs}", step=f"{it + 1}/{steps}", loss=loss_sum.item() / nb,
                     samples_per_s=seen / max(dt, 1e-9), eta=eta(dt, it + 1, steps))
        if state.step % log.every == 0:
            tracker.log_metrics({f"train/{k}": float(v.detach()) for k, v in terms.items()}
                                | {"train/lr": run.optimizer.param_groups[0]["lr"]}, step=state.step)
    bar.close()
    if sync_every > 1 and checked < nb:  # never a checkpoint of weights a non-finite step touched
        _check_finite(nonfinite, epoch, checked, nb - 1, last, sync_every)
    run.progress.write(epoch + 1, run.max_epochs, nb, steps, loss_sum.item() / max(1, nb))
    return {"epoch": epoch + 1, "loss": loss_sum.item() / max(1, nb),
            "samples_per_s": seen / max(1e-9, time.time() - t0), "lr": run.optimizer.param_groups[0]["lr"],
            "seconds": time.time() - t0, **{f"train_{k}": v.item() / max(1, nb) for k, v in term_sums.items()}}


def validate_epoch(run: TrainRun, epoch: int, row: dict[str, Any], tracker: Tracker) -> None:
    """Main process, at a validation epoch: the validation metrics and spread into ``row``; the epoch's log line."""
    if (epoch + 1) % run.settings.validation.every == 0 or epoch + 1 == run.max_epochs:
        fault_point("validate")
        metrics, spread = validate(run.model, run.settings, run.val_data, run.val_feats, run.device)
        row.update({"val_rsum": metrics["rsum"], **{f"val_{d}_{k}": metrics[d][k] for d in ("i2t", "t2i")
                                                     for k in ("r1", "r5", "r10")},
                    "val_sim_mean": spread["mean"], "val_sim_std": spread["std"], "val_margin": spread["margin"]})
        tracker.log_metrics(metrics_to_flat(metrics, "val"), step=epoch + 1)
    # always (with or without a bar): the line a job log shows per epoch, and in MLflow
    tracker.log_metrics({"train/epoch_loss": row["loss"], "train/samples_per_s": row["samples_per_s"],
                         "train/epoch_seconds": row["seconds"]}, step=epoch + 1)
    log_line(f"epoch {epoch + 1}/{run.max_epochs}", loss=row["loss"], val_rsum=row.get("val_rsum"),
             samples_per_s=row["samples_per_s"], seconds=row["seconds"])


def record_best(run: TrainRun, state: TrainState, epoch: int, row: dict[str, Any]) -> bool:
    """Main process: whether ``epoch`` is the best so far; keeps a CPU copy of the best weights once they are no
    longer the current ones."""
    is_best = row.get("val_rsum", -math.inf) > state.best_rsum
    if is_best:
        state.best_rsum, state.best_epoch = row["val_rsum"], epoch + 1
        state.best_val_similarity = {"mean": row["val_sim_mean"], "std": row["val_sim_std"]}
        state.best_model = None  # the current weights are the best: last.pt's "model"
    elif state.best_model is None and state.best_epoch > 0:
        state.best_model = _cpu_copy(load_checkpoint(run.out / checkpoint_files.BEST, "cpu")["model"])
    return is_best


def apply_stopping(run: TrainRun, state: TrainState, epoch: int, row: dict[str, Any]) -> None:
    """Main process: the stopping rule on the epoch's validation RSUM (xmr/train/stopping.py)."""
    es, sched = run.settings.stopping, run.settings.schedule
    if "val_rsum" not in row or not stopping.uses_rule(es, sched):
        return
    event = stopping.update(state.stopping, row["val_rsum"], epoch + 1, es, sched)
    if event in ("lr_drop", "stop"):
        print(f"epoch {epoch + 1}: validation RSUM has not improved for {es.patience} epoch(s): "
              + ("learning rate x" + str(sched.gamma) if event == "lr_drop"
                 else f"plateau reached, stopping (best epoch {state.best_epoch})"), flush=True)


def save_epoch(run: TrainRun, state: TrainState, is_best: bool) -> None:
    """Main process: last.pt, best.pt at a best epoch, history.csv."""
    parts = {"model": run.model.state_dict(), "optimizer": run.optimizer.state_dict(),
             "vocab_words": run.vocab_words, "image_dim": run.image_dim, "config_sha256": run.config_sha,
             "inputs_sha256": run.inputs_sha, "world_size": run.ctx.world_size}
    fault_point("checkpoint")
    checkpoint_files.write_last(run.out, parts, state.saved(), state.best_model)
    if is_best:
        checkpoint_files.write_best(run.out / checkpoint_files.BEST, parts["model"], run.vocab_words, run.image_dim,
                                    state.epoch, state.best_rsum)
    _write_history(run.out / "history.csv", state.history)


def end_epoch(run: TrainRun, state: TrainState, epoch: int, row: dict[str, Any], tracker: Tracker) -> bool:
    """Validation, the best epoch, the stopping rule and the checkpoints after ``epoch``; every process takes the
    main process's stopping decision. Returns whether training stops here."""
    ctx = run.ctx
    if ctx.is_main:
        validate_epoch(run, epoch, row, tracker)
    state.history.append(row)
    state.epoch = epoch
    if ctx.is_main:
        is_best = record_best(run, state, epoch, row)
        apply_stopping(run, state, epoch, row)
        save_epoch(run, state, is_best)
    ctx.barrier()
    if not stopping.uses_rule(run.settings.stopping, run.settings.schedule):
        return False
    state.stopping = ctx.from_main(lambda: state.stopping)
    run.stepper.plateau_drops = state.stopping["lr_drops"]
    return bool(state.stopping["stopped"])


def summarize(run: TrainRun, state: TrainState, experiment: str) -> dict[str, Any]:
    """train.json's contents."""
    cfg = run.cfg
    return {"recipe": cfg["name"], "method": cfg["method"], "dataset": cfg["dataset"],
            "best_epoch": state.best_epoch, "best_val_rsum": state.best_rsum,
            "epochs": cfg["train"]["epochs"], "mlflow_run_id": state.run_id, "experiment": experiment,
            "train_seconds": sum(r.get("seconds", 0) for r in state.history), "cpu_threads": torch.get_num_threads(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY") or "default",
            **stopping.summary(state.stopping, len(state.history), run.settings.stopping),
            "val_similarity": state.best_val_similarity,
            "history": state.history}


def train(cfg: dict, out_dir: str | os.PathLike, resume: bool = True, progress: bool = True) -> dict[str, Any]:
    """Train ``cfg`` (a resolved run config from :func:`xmr.run.config.load_run_config`) into ``out_dir``, its one
    writer: a second training of a live ``out_dir`` fails in one line naming the holder (:mod:`xmr.run.lock`)."""
    with process_run_lock(out_dir, dist.process_rank()):
        out = Path(out_dir)
        ctx = dist.setup()
        run = set_up(cfg, out, ctx)
        state, resumed = resume_state(run, resume)
        start_epochs(run, state)
        tracking = run.settings.tracking
        tracker = Tracker(tracking.enabled and ctx.is_main)
        experiment = tracking.experiment_name
        # mlflow_run_id beside last.pt: a resumed training continues its run, a restarted one marks it KILLED
        with tracker.run(experiment, tracking.name, run_id=state.run_id,
                         tags=run_tags(run), id_file=out / "mlflow_run_id", resume=resumed):
            state.run_id = tracker.run_id
            if state.epoch < 0:
                tracker.log_params({k: v for k, v in cfg.items() if k not in ("dataset_cfg",)})
            for epoch in range(state.epoch + 1, run.max_epochs):
                if state.stopping["stopped"]:  # a resumed run that had already met its plateau
                    break
                row = run_epoch(run, state, epoch, tracker, progress)
                if end_epoch(run, state, epoch, row, tracker):
                    break
            summary = summarize(run, state, experiment)
            if ctx.is_main:
                write_json(out / "train.json", summary)
                tracker.log_artifact(str(out / "config.yaml"))
                tracker.log_artifact(str(out / "history.csv"))
                tracker.set_tags({"best_checkpoint": str((out / checkpoint_files.BEST).resolve())})
        dist.cleanup(ctx)
        return summary
