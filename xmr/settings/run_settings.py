"""The run config turned into typed settings, once: :func:`run_settings`.

The trainer and the ``xmr`` commands hold the run config (a validated dict, :mod:`xmr.run.config`). Below them each
part takes the frozen settings of its own concern and nothing else, so that a signature says what a part depends
on and a key renamed in the schema fails here, when the settings are built, not in whichever part reads it:

- :class:`ImageInput`: ``features.{source,dir,backbone,max_regions}``, ``image_backbone.*``; end to end the
  prepared input (:class:`ImagePreparation`). Read by the loaders, the image backbone, the run inputs, encoding.
- :class:`TextInput`: ``text.{encoder,tokenizer,min_word_count,features_dir}``, ``features.text``. The vocabulary,
  the run inputs, the precomputed text features.
- :class:`Batching`: ``train.{batch_size,batch_by,sampler,positives,mask_same_image,workers,gather_negatives}``.
  Samplers, positives, the epoch's loader.
- :class:`Process`: ``train.{device,threads,seed,deterministic,fill_uninitialized_memory,amp}``. The process set-up.
- :class:`Schedule`: ``optim.schedule.*``, ``train.epochs``. The learning rate of a step.
- :class:`Stopping`: ``train.early_stopping.*``. The stopping rule.
- :class:`Validation`: ``train.{val_every,val_max_images}``, ``eval.batch_size``. Validation and encoding.
- :class:`Logging`: ``train.{log_every,log_every_steps}``. The epoch loop.
- :class:`Tracking`: ``tracking.*``. MLflow.

A method's own settings (``model``, ``loss``, ``eval`` scoring, the text encoder) are its
:class:`xmr.methods.base.MethodSettings`, built by the method's door (``RetrievalModel.settings_of``); the
optimizer reads the ``optim`` section itself. Each class's ``KEYS`` maps a field to its schema key (the
conformance test, tests/test_run_settings.py, holds them to the schema: same keys, same defaults); ``DERIVED``
fields are decided here from several keys (``Stopping.cap``: the epoch cap).
"""

from __future__ import annotations

import copy
import dataclasses
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

from xmr.core.errors import XmrError


def _in_schema(dotted: str) -> bool:
    from xmr.config.loader import load_schema

    node = load_schema("run")
    for part in dotted.split("."):
        node = node.get("properties", {}).get(part)
        if node is None:
            return False
    return True


def feature_file(features_dir: str | os.PathLike, dataset: str, backbone: str, split: str) -> Path:
    """``{features_dir}/{dataset}/{backbone}/{split}.h5``: shared by every method using that backbone."""
    return Path(features_dir) / dataset / backbone / f"{split}.h5"


def _key(cfg: dict, dotted: str) -> Any:
    """The value of ``dotted`` in a validated config; None for a schema key without a default that is not set."""
    node = cfg
    for part in dotted.split("."):
        if part not in node and _in_schema(dotted):
            return None
        node = node[part]
    return node


def _fill(cls: type, cfg: dict, **derived: Any) -> Any:
    """``cls`` filled from its ``KEYS`` (a validated config: the schema filled the defaults) and ``derived``."""
    try:
        values = {f: copy.deepcopy(_key(cfg, k)) for f, k in cls.KEYS.items()}
    except KeyError as e:
        raise XmrError(f"{cls.__name__}: key {e} is not in the run config; make {cls.__name__}.KEYS the run "
                       f"schema's keys") from None
    return cls(**values, **derived)


@dataclass(frozen=True)
class ImagePreparation:
    """How an end-to-end run prepares its images, decided by :func:`image_preparation` (the backbone entry with
    ``image_backbone.input_size`` applied; its input size, resize mode and max size, as ``xmr extract`` uses them)."""

    backbone_config: dict
    size: int
    resize: str
    max_size: int | None


@dataclass(frozen=True)
class ImageInput:
    """The image side of a run: precomputed features (``features.*``) or, end to end, image files through a
    fine-tuned backbone (``image_backbone.*``)."""

    KEYS: ClassVar[dict[str, str]] = {
        "source": "features.source", "features_dir": "features.dir", "backbone": "features.backbone",
        "max_regions": "features.max_regions", "input_size": "image_backbone.input_size",
        "frozen_epochs": "image_backbone.frozen_epochs", "unfreeze_loss_ramp": "image_backbone.unfreeze_loss_ramp",
        "freeze_bn": "image_backbone.freeze_bn", "crop_scale": "image_backbone.crop_scale",
        "hflip": "image_backbone.hflip"}
    DERIVED: ClassVar[tuple[str, ...]] = ("name", "dataset", "backbone_entry")

    source: str
    features_dir: str
    backbone: str | None
    max_regions: int | None
    input_size: int | None
    frozen_epochs: int
    unfreeze_loss_ramp: bool
    freeze_bn: bool
    crop_scale: list[float] | None
    hflip: float
    name: str  # the run's name, which errors name
    dataset: str
    backbone_entry: dict | None  # config/backbones.yaml's entry of ``backbone`` (the run config's backbone_cfg)

    @property
    def end_to_end(self) -> bool:
        """True when the run trains from image files through a backbone (``features.source: images``)."""
        return self.source == "images"

    def feature_path(self, split: str) -> Path:
        """``{features.dir}/{dataset}/{backbone}/{split}.h5``."""
        return feature_file(self.features_dir, self.dataset, self.backbone, split)

    @cached_property
    def preparation(self) -> ImagePreparation:
        """End to end: how the images are prepared (:func:`image_preparation`; checked on first use)."""
        return image_preparation(self)

    def backbone_frozen(self, epoch: int) -> bool:
        """Whether the backbone is frozen in (0-based) ``epoch``."""
        return epoch < self.frozen_epochs

    def loss_scale(self, epoch: int, step: int, steps_per_epoch: int) -> float:
        """VSE∞'s ``warmup_alpha``: step / steps in the first epoch after unfreezing (``unfreeze_loss_ramp``), else 1."""
        if not (self.end_to_end and self.unfreeze_loss_ramp) or epoch != self.frozen_epochs:
            return 1.0
        return step / max(1, steps_per_epoch)


def _backbone_class(image: ImageInput):
    from xmr.core.registry import import_submodules
    from xmr.features.backbones import BACKBONES

    if not image.backbone or image.backbone_entry is None:
        raise XmrError(f"{image.name}: features.backbone: end-to-end training (features.source: images) needs a "
                       f"backbone key of config/backbones.yaml (e.g. efficientnet_lite0, resnext101_wsl_512)")
    import_submodules("xmr.features.backbones")
    name = image.backbone_entry["name"]
    if name not in BACKBONES:
        raise XmrError(f"{image.name}: features.backbone: {image.backbone} names backbone {name!r}, which is not "
                       f"registered; choose one of {', '.join(BACKBONES.names())}")
    return BACKBONES.get(name)


def image_preparation(image: ImageInput) -> ImagePreparation:
    """The one place the input of an end-to-end run is decided and checked beyond the schema (one-line errors
    naming the key): a grid backbone, a resize mode that gives same-size images, a ``crop_scale`` of low <= high."""
    from xmr.features.extract import input_settings

    cls = _backbone_class(image)
    if getattr(cls, "supports_keep_aspect", False) or getattr(cls, "needs_boxes", False):
        raise XmrError(f"{image.name}: features.backbone: {image.backbone} is a region backbone; end-to-end "
                       f"training needs a grid backbone (efficientnet_lite0, resnet50, resnet152, resnext101_32x8d); "
                       f"precompute region features with `xmr extract` and use features.source: precomputed")
    bcfg = dict(image.backbone_entry)
    if image.input_size:
        bcfg["input_size"] = image.input_size
    size, resize, max_size = input_settings(bcfg, cls)
    if resize == "shorter_side":
        raise XmrError(f"{image.name}: config/backbones.yaml:{image.backbone}: resize shorter_side; end-to-end "
                       f"training batches same-size images: use squash or center_crop")
    if image.crop_scale is not None and image.crop_scale[0] > image.crop_scale[1]:
        raise XmrError(f"{image.name}: image_backbone.crop_scale: {image.crop_scale}: expected [low, high] with "
                       f"low <= high (VSE∞: [0.6, 1.0])")
    return ImagePreparation(bcfg, size, resize, max_size)


@dataclass(frozen=True)
class TextInput:
    """What the run reads on the text side besides the encoder's own settings: the tokenizer and vocabulary
    options, and where precomputed caption features live."""

    KEYS: ClassVar[dict[str, str]] = {
        "encoder": "text.encoder", "tokenizer": "text.tokenizer", "min_word_count": "text.min_word_count",
        "features_dir": "text.features_dir", "features": "features.text"}
    DERIVED: ClassVar[tuple[str, ...]] = ("precomputed_dir",)

    encoder: str
    tokenizer: str
    min_word_count: int
    features_dir: str | None
    features: str | None
    precomputed_dir: Path | None  # text.features_dir, or {features.dir}/{dataset}/{features.text}; None: neither

    def required_features_dir(self, name: str) -> Path:
        """``precomputed_dir`` for a ``precomputed`` text encoder, which needs one (one-line error naming the run)."""
        if self.precomputed_dir is None:
            raise XmrError(f"{name}: text.encoder is 'precomputed' but neither features.text (e.g. hglmm) nor "
                           f"text.features_dir is set")
        return self.precomputed_dir


@dataclass(frozen=True)
class Batching:
    """Which training pairs share a batch and which of them are positives (xmr/train/samplers.py)."""

    KEYS: ClassVar[dict[str, str]] = {
        "batch_size": "train.batch_size", "sampler": "train.sampler", "positives": "train.positives",
        "mask_same_image": "train.mask_same_image", "workers": "train.workers",
        "gather_negatives": "train.gather_negatives", "batch_by": "train.batch_by"}
    DERIVED: ClassVar[tuple[str, ...]] = ()

    batch_size: int  # pairs, or images with batch_by: image
    sampler: str
    positives: str
    mask_same_image: bool
    workers: int
    gather_negatives: bool
    batch_by: str


@dataclass(frozen=True)
class Process:
    """The training process: device, threads, seed and determinism, mixed precision."""

    KEYS: ClassVar[dict[str, str]] = {
        "device": "train.device", "threads": "train.threads", "seed": "train.seed",
        "deterministic": "train.deterministic", "fill_uninitialized_memory": "train.fill_uninitialized_memory",
        "amp": "train.amp"}
    DERIVED: ClassVar[tuple[str, ...]] = ()

    device: str
    threads: int | None
    seed: int
    deterministic: bool
    fill_uninitialized_memory: bool
    amp: bool


@dataclass(frozen=True)
class Schedule:
    """The learning-rate schedule (xmr/train/schedule.py) over ``train.epochs``."""

    KEYS: ClassVar[dict[str, str]] = {
        "epochs": "train.epochs", "name": "optim.schedule.name", "step_epochs": "optim.schedule.step_epochs",
        "plateau_drops": "optim.schedule.plateau_drops", "gamma": "optim.schedule.gamma",
        "warmup_epochs": "optim.schedule.warmup_epochs", "min_lr": "optim.schedule.min_lr"}
    DERIVED: ClassVar[tuple[str, ...]] = ()

    epochs: int
    name: str
    step_epochs: list[int]
    plateau_drops: int
    gamma: float
    warmup_epochs: float
    min_lr: float


@dataclass(frozen=True)
class Stopping:
    """The stopping rule (xmr/train/stopping.py); ``cap``: the epochs a run trains at most."""

    KEYS: ClassVar[dict[str, str]] = {
        "enabled": "train.early_stopping.enabled", "patience": "train.early_stopping.patience",
        "min_delta": "train.early_stopping.min_delta", "max_epochs": "train.early_stopping.max_epochs",
        "warmup_epochs": "train.early_stopping.warmup_epochs"}
    DERIVED: ClassVar[tuple[str, ...]] = ("cap",)

    enabled: bool
    patience: int
    min_delta: float
    max_epochs: int | None
    warmup_epochs: int
    cap: int


@dataclass(frozen=True)
class Validation:
    """Validation during training and the batch size every encoding uses."""

    KEYS: ClassVar[dict[str, str]] = {
        "every": "train.val_every", "max_images": "train.val_max_images", "batch_size": "eval.batch_size"}
    DERIVED: ClassVar[tuple[str, ...]] = ()

    every: int
    max_images: int | None
    batch_size: int


@dataclass(frozen=True)
class Logging:
    """How often the epoch loop logs: MLflow metrics every ``every`` steps, a log line every ``every_steps``
    steps without a progress bar."""

    KEYS: ClassVar[dict[str, str]] = {"every": "train.log_every", "every_steps": "train.log_every_steps"}
    DERIVED: ClassVar[tuple[str, ...]] = ()

    every: int
    every_steps: int | None


@dataclass(frozen=True)
class Tracking:
    """MLflow: whether a run is tracked, and under which experiment and run name (defaults decided here)."""

    KEYS: ClassVar[dict[str, str]] = {
        "enabled": "tracking.enabled", "experiment": "tracking.experiment", "run_name": "tracking.run_name"}
    DERIVED: ClassVar[tuple[str, ...]] = ("experiment_name", "name")

    enabled: bool
    experiment: str | None
    run_name: str | None
    experiment_name: str  # ``experiment``, else xmr/{dataset}
    name: str  # ``run_name``, else the run's name


SETTINGS_CLASSES = (ImageInput, TextInput, Batching, Process, Schedule, Stopping, Validation, Logging, Tracking)


@dataclass(frozen=True)
class RunSettings:
    """Every typed setting of a run, built once by :func:`run_settings`; ``dataset_config`` is the dataset's own
    config (config/datasets/*.yaml, validated)."""

    name: str
    method: str
    dataset: str
    dataset_config: dict
    image: ImageInput
    text: TextInput
    batching: Batching
    process: Process
    schedule: Schedule
    stopping: Stopping
    validation: Validation
    logging: Logging
    tracking: Tracking


def text_features_dir(cfg: dict) -> Path | None:
    """Where a run's precomputed text features live: ``text.features_dir``, or
    ``{features.dir}/{dataset}/{features.text}``; None when neither names it."""
    if cfg["text"]["features_dir"]:
        return Path(cfg["text"]["features_dir"])
    kind = cfg["features"]["text"]
    return Path(cfg["features"]["dir"]) / cfg["dataset"] / kind if kind else None


def text_input(cfg: dict) -> TextInput:
    """The :class:`TextInput` of a validated run config."""
    return _fill(TextInput, cfg, precomputed_dir=text_features_dir(cfg))


def max_epochs(cfg: dict) -> int:
    """The epoch cap of a run config: ``train.early_stopping.max_epochs`` when set and the rule is on, else
    ``train.epochs``."""
    es = cfg["train"]["early_stopping"]
    return es["max_epochs"] if es["enabled"] and es["max_epochs"] else cfg["train"]["epochs"]


def run_settings(cfg: dict) -> RunSettings:
    """The typed settings of a validated run config (:func:`xmr.run.config.load_run_config` or
    :func:`~xmr.run.config.load_saved_config`), each built here and nowhere else."""
    name, dataset = cfg.get("name", "run config"), cfg["dataset"]
    image = _fill(ImageInput, cfg, name=name, dataset=dataset, backbone_entry=copy.deepcopy(cfg.get("backbone_cfg")))
    return RunSettings(
        name=name, method=cfg["method"], dataset=dataset, dataset_config=cfg["dataset_cfg"], image=image,
        text=text_input(cfg),
        batching=_fill(Batching, cfg), process=_fill(Process, cfg), schedule=_fill(Schedule, cfg),
        stopping=_fill(Stopping, cfg, cap=max_epochs(cfg)), validation=_fill(Validation, cfg),
        logging=_fill(Logging, cfg),
        tracking=_fill(Tracking, cfg, experiment_name=cfg["tracking"]["experiment"] or f"xmr/{dataset}",
                       name=cfg["tracking"]["run_name"] or name))


def settings_fields(cls: type) -> list[str]:
    """The field names of a settings class (the conformance test's view)."""
    return [f.name for f in dataclasses.fields(cls)]
