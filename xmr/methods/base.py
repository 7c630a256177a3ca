"""The interface every method implements, and the method registry."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from xmr.core.errors import XmrError
# registers the "precomputed" text encoder (RRF's HGLMM features) before any run schema is filled
from xmr.core.registry import Registry
import xmr.models.text_precomputed  # noqa: F401
from xmr.settings.run_settings import TextInput, text_input

METHODS: Registry[type["RetrievalModel"]] = Registry("method")


def strict_section(properties: dict[str, Any], required: list[str] | None = None) -> dict:
    """JSON-schema object with the given properties and nothing else (catches misspelt keys)."""
    out: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": properties}
    if required:
        out["required"] = required
    return out


def settings_from(settings_class: type, section: dict, where: str) -> Any:
    """A method's frozen settings (a dataclass) filled from a validated config section: every field takes its value
    from the section (the schema filled the defaults), so a field without one, or a key without a field, is a
    drift between the dataclass and the schema and fails here, when the model is built."""
    fields = dataclasses.fields(settings_class)
    names = [f.name for f in fields]
    # a field defaulting to None stands for a schema property without a default: absent from the section
    optional = {f.name for f in fields if f.default is None}
    missing = [n for n in names if n not in section and n not in optional]
    extra = sorted(set(section) - set(names))
    if missing or extra:
        raise XmrError(f"{where}: {settings_class.__name__} and the method's schema disagree (no value for "
                       f"{missing}, no field for {extra}); make the dataclass's fields the schema's properties")
    return settings_class(**{n: copy.deepcopy(section[n]) for n in names if n in section})


@dataclass(frozen=True)
class Scoring:
    """The ``eval`` keys a model reads: its test-time similarity, the set similarities' α and the re-rankers'
    parameters (PCME checks that they fit its score)."""
    similarity: str
    alpha: float
    rerank: dict


@dataclass(frozen=True)
class MethodSettings:
    """Everything a method is built from, read from the run config once by :meth:`RetrievalModel.settings_of`:
    its own ``model`` and ``loss`` sections as its ``model_settings``/``loss_settings`` dataclasses, the
    ``text`` section the text encoder is built from (``features_dir`` resolved for precomputed features) and
    ``train.seed`` (word-vector initialisation)."""
    method: str
    model: Any
    loss: Any
    scoring: Scoring
    text: dict
    seed: int


class RetrievalModel(nn.Module):
    """A dual encoder trained by :mod:`xmr.train.trainer` and evaluated by :mod:`xmr.evaluation`.

    Subclasses set ``schema`` (JSON schema for their ``model``/``loss`` config sections, with defaults; a built-in
    method's is its file ``xmr/schemas/methods/<name>.schema.yaml``, :func:`xmr.config.loader.method_schema`),
    ``model_settings_class``/``loss_settings_class`` (frozen dataclasses whose fields are exactly those sections' properties;
    the conformance test checks them against the schema) and implement ``encode_image``, ``encode_text`` and
    ``compute_loss``. Embeddings are (B, D) or sets (B, K, D); ``eval_similarity`` names the
    :mod:`xmr.similarity.measures` measure used to compare them at test time.

    Built from :meth:`settings_of`, the method's only reader of the run config; a method reads its settings
    (``self.model_settings``, ``self.loss_settings``, ``self.scoring``) and never the config.
    """

    schema: ClassVar[dict] = {}
    model_settings_class: ClassVar[type]
    loss_settings_class: ClassVar[type]
    # True when compute_loss is a function of the forward's output (every tensor in it has one row per pair of the
    # batch; the trainer gathers them all), the positives and parameters only, so that DDP can gather every
    # process's pairs into one global batch (train.gather_negatives)
    gathered_loss: ClassVar[bool] = False
    # config sections that make the method small enough for the registry's conformance test at toy size (48
    # training images, embeddings of 32; tests/test_method_conformance.py); a new method sets what it needs
    conformance_overrides: ClassVar[dict] = {}
    # a method that needs files of its own at toy size (a checkpoint folder) also defines a static
    # ``conformance_setup(config_dir, folder) -> dict`` of further sections (xmr/methods/clip.py)

    @classmethod
    def settings_of(cls, run_cfg: dict, text: TextInput | None = None) -> MethodSettings:
        """The method's settings from a validated run config (its schema's defaults filled): the one reader of a
        run config's ``model``, ``loss``, ``eval`` scoring and text-encoder keys. ``text``: the run's
        :class:`~xmr.settings.run_settings.TextInput` (where precomputed caption features live; None: read from
        ``run_cfg`` when the encoder needs it)."""
        name = run_cfg["method"]
        ev = run_cfg["eval"]
        section = copy.deepcopy(run_cfg["text"])
        if section["encoder"] == "precomputed":
            text = text or text_input(run_cfg)
            section["features_dir"] = str(text.required_features_dir(run_cfg.get("name", "recipe")))
        return MethodSettings(
            method=name,
            model=settings_from(cls.model_settings_class, run_cfg["model"], f"{name}: model"),
            loss=settings_from(cls.loss_settings_class, run_cfg["loss"], f"{name}: loss"),
            scoring=Scoring(similarity=ev["similarity"], alpha=ev["alpha"], rerank=copy.deepcopy(ev["rerank"])),
            text=section, seed=run_cfg["train"]["seed"])

    @classmethod
    def from_config(cls, run_cfg: dict, image_dim: int, vocab_words: list[str] | None) -> "RetrievalModel":
        """The method built from a validated run config (:meth:`settings_of`; for tests and scripts)."""
        return cls(cls.settings_of(run_cfg), image_dim, vocab_words)

    def __init__(self, settings: MethodSettings, image_dim: int, vocab_words: list[str] | None) -> None:
        super().__init__()
        self.method_name = settings.method
        self.model_settings, self.loss_settings, self.scoring = settings.model, settings.loss, settings.scoring
        self.embed_dim = settings.model.embed_dim
        self.seed = settings.seed  # train.seed: word vectors without a pretrained one start from it
        self._text_section, self._vocab_words = settings.text, vocab_words
        # end-to-end training (features.source: images): the trainer attaches an xmr.models.image_backbone.FinetunedBackbone
        self.image_backbone: nn.Module | None = None

    # -- encoders ---------------------------------------------------------------------------------
    def image_local_features(self, image_input: torch.Tensor,
                             num_regions: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, R, F) local features + (B,) counts: precomputed features pass through; with an image backbone
        (end to end), ``image_input`` is uint8 pixels (B, 3, H, W) and goes through it."""
        if self.image_backbone is None:
            return image_input, num_regions
        return self.image_backbone(image_input)

    def embed_images(self, image_input: torch.Tensor, num_regions: torch.Tensor | None) -> torch.Tensor:
        """Image embeddings from a batch as the data loaders give it (features or pixels)."""
        return self.encode_image(*self.image_local_features(image_input, num_regions))

    def encode_image(self, feats: torch.Tensor, num_regions: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def encode_text(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def build_text_encoder(self) -> nn.Module:
        """The run's text encoder (``text`` section) into the joint width. Each method calls this
        once in ``__init__``, where its parameters are initialised (the order of initialisation fixes the
        random weights a seed gives)."""
        from xmr.models.text import build_text_encoder

        return build_text_encoder(self._text_section, self.embed_dim, self._vocab_words, self.seed)

    def image_outputs(self, feats: torch.Tensor, num_regions: torch.Tensor) -> dict[str, torch.Tensor]:
        """``img`` (the image embeddings) and whatever else of the image side the loss (or a figure) reads:
        set methods add their sub-embedding residuals, slots or masks. Default: the embeddings."""
        return {"img": self.encode_image(feats, num_regions)}

    def text_outputs(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``txt`` (the caption embeddings) and whatever else of the text side the loss reads."""
        return {"txt": self.encode_text(batch)}

    def forward(self, feats: torch.Tensor, num_regions: torch.Tensor, text: dict[str, torch.Tensor],
                image_index: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Both encoders in one call (one forward per backward, as DistributedDataParallel expects): what
        :meth:`compute_loss` reads, ``img`` and ``txt`` embeddings and any per-pair tensors a method's loss needs
        (residuals, slots, masks), each with one row per pair of the batch (the trainer gathers them across
        processes with ``train.gather_negatives``). ``image_index``: the (B,) dataset image indices (memory
        banks recognise entries of the same image by them)."""
        return {**self.image_outputs(feats, num_regions), **self.text_outputs(text)}

    # -- training ---------------------------------------------------------------------------------
    def compute_loss(self, out: dict[str, torch.Tensor], positives: torch.Tensor,
                     epoch: float) -> dict[str, torch.Tensor]:
        """From :meth:`forward`'s output and the (B, B) positives mask (rows images, columns captions): a dict
        with the total ``loss`` and any named terms (logged separately)."""
        raise NotImplementedError

    def prepare(self, train_split) -> None:
        """Hook the trainer calls once with the training split (:class:`~xmr.data.base.CaptionedSplit`) before
        training starts: data-dependent state (CODER's concept vocabulary) is built here, so no method reads
        data on its own. Default: nothing."""

    def on_train_step_end(self, out: dict[str, torch.Tensor]) -> None:
        """Hook for momentum encoders, queues, ... (called after each optimizer step with the step's local
        :meth:`forward` output)."""

    # -- evaluation -------------------------------------------------------------------------------
    @property
    def eval_similarity(self) -> str:
        return self.scoring.similarity

    def similarity_matrix(self, img: torch.Tensor, txt: torch.Tensor) -> torch.Tensor:
        """(N, M) image-caption scores for evaluation (chunked inside xmr.similarity.measures)."""
        from xmr.similarity.measures import compute_similarity

        return compute_similarity(img, txt, measure=self.eval_similarity, alpha=self.scoring.alpha)

    def param_groups(self, lr: float, backbone_scale: float) -> list[dict]:
        """Optimizer groups: pretrained text-encoder weights get ``lr * backbone_scale``."""
        pre = getattr(getattr(self, "text", None), "pretrained_params", [])
        slow, fast = [], []
        for name, p in self.named_parameters():
            if not p.requires_grad:
                continue
            (slow if any(name.startswith(f"text.{q}") for q in pre) else fast).append(p)
        groups = [{"params": fast, "lr": lr, "name": "main"}]
        if slow:
            groups.append({"params": slow, "lr": lr * backbone_scale, "name": "text_backbone"})
        return groups

    def with_image_backbone_group(self, groups: list[dict], lr: float) -> list[dict]:
        """``groups`` (from :meth:`param_groups`, possibly a subclass's) with the end-to-end image backbone's
        parameters moved into their own group ``image_backbone`` at ``lr``; unchanged without a backbone."""
        if self.image_backbone is None:
            return groups
        mine = [p for p in self.image_backbone.parameters() if p.requires_grad]
        ids = {id(p) for p in mine}
        rest = [{**g, "params": [p for p in g["params"] if id(p) not in ids]} for g in groups]
        return [g for g in rest if g["params"]] + [{"params": mine, "lr": lr, "name": "image_backbone"}]
