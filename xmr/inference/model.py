"""Inference: build or load a trained model, encode, score and search — no training objects.

The trainer (:mod:`xmr.train.trainer`), ``xmr score``/``xmr score-bank``, the report and the public API
(:func:`xmr.load`) all use this module. Library/training split after open_clip: this module never imports the
trainer.

    import xmr
    m = xmr.load("runs/synth/dvse_demo")     # run dir, checkpoint (.pt) or MLflow run id
    txt = m.encode_text(["a red circle left of a square"])
    img = m.encode_image(["data/synth/images/000001.png"])   # image files, through the configured backbone
    scores = m.similarity(img, txt)          # the method's own measure (set-based ones included)

The public ``Model`` speaks NumPy: every method returns float32 ``np.ndarray``s on the CPU and takes NumPy arrays
or torch tensors. Everything else here (``encode_split`` the function, ``score_split``, the trainer's use) is torch.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader

from xmr.core.errors import XmrError
from xmr.methods import METHODS, RetrievalModel
from xmr.methods.base import MethodSettings
from xmr.models.text import text_cfg_for_checkpoint
from xmr.core.progress import log_line
from xmr.core.io import load_checkpoint
from xmr.inference.loaders import CaptionCollate, CaptionDataset, image_input, image_loader_parts, load_split_images
from xmr.models.image_backbone import build_image_backbone
from xmr.settings.run_settings import ImageInput, RunSettings, run_settings
from xmr.core.utils import resolve_device


def build_model(method: MethodSettings, image: ImageInput, image_dim: int | None, vocab_words: list[str] | None,
                pretrained_backbone: bool = True) -> RetrievalModel:
    """The run's method (its settings: ``RetrievalModel.settings_of``); end to end (``features.source: images``)
    with its image backbone attached as ``model.image_backbone`` (``image_dim`` is then the backbone's;
    ``pretrained_backbone=False`` skips loading the backbone's pretrained file when a checkpoint supplies the
    weights)."""
    backbone = build_image_backbone(image, pretrained_backbone) if image.end_to_end else None
    if backbone is not None:
        image_dim = backbone.feature_dim
    model = METHODS.get(method.method)(method, image_dim, vocab_words)
    if backbone is not None:
        model.image_backbone = backbone
    return model


def model_from_config(cfg: dict, image_dim: int | None, vocab_words: list[str] | None,
                      pretrained_backbone: bool = True) -> RetrievalModel:
    """:func:`build_model` of a resolved run config (for the commands and scripts that hold one)."""
    settings = run_settings(cfg)
    return build_model(METHODS.get(settings.method).settings_of(cfg, settings.text), settings.image, image_dim,
                       vocab_words, pretrained_backbone)


def _to(batch: dict, device: torch.device) -> dict:
    return {k: (v.to(device, non_blocking=True) if torch.is_tensor(v) else v) for k, v in batch.items()}


@torch.no_grad()
def encode_split(model: RetrievalModel, image: ImageInput, data, feats, device: torch.device, batch_size: int,
                 workers: int = 0, max_images: int | None = None,
                 progress: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Embeddings of the first ``max_images`` images of a split and of their captions (eval mode), in batches of
    ``batch_size`` (``eval.batch_size``). ``feats``: the split's image side from
    :func:`xmr.inference.loaders.load_split_images` (features or image files, decoded by ``workers`` processes)."""
    from tqdm import tqdm

    model.eval()
    n = data.num_images if max_images is None else min(max_images, data.num_images)
    cap_idx = [j for j in range(data.num_captions) if data.caption_image[j] < n]
    text_collate = CaptionCollate(model.text.collate, data.split)
    img_set, img_collate = image_loader_parts(feats, list(range(n)), image.max_regions)
    img_workers = workers if image.end_to_end else 0  # decoding images is the slow part
    img_loader = DataLoader(img_set, batch_size=batch_size, collate_fn=img_collate, num_workers=img_workers)
    cap_loader = DataLoader(CaptionDataset(data, cap_idx), batch_size=batch_size, collate_fn=text_collate)
    imgs, caps = [], []
    for b in tqdm(img_loader, desc="encode images", unit="batch", disable=not progress):
        imgs.append(model.embed_images(*image_input(b, device)).float().cpu())
    for b in tqdm(cap_loader, desc="encode captions", unit="batch", disable=not progress):
        caps.append(model.encode_text(_to(b["text"], device)).float().cpu())
    return torch.cat(imgs), torch.cat(caps)


def encode_split_of(model: RetrievalModel, settings: RunSettings, data, feats, device: torch.device,
                    max_images: int | None = None, progress: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`encode_split` with a run's settings (``eval.batch_size``; end to end, ``train.workers`` decoders)."""
    return encode_split(model, settings.image, data, feats, device, settings.validation.batch_size,
                        settings.batching.workers, max_images, progress)


def load_trained(run_dir: str | os.PathLike, device: str | torch.device = "cpu",
                 checkpoint: str | os.PathLike | None = None) -> tuple[RetrievalModel, dict]:
    """(model in eval mode on ``device``, resolved config) from a finished run directory (``best.pt``, or
    ``checkpoint`` when given). Only the weights are read: no optimizer state."""
    from xmr.run.config import load_saved_config

    run_dir = Path(run_dir)
    cfg = load_saved_config(run_dir)
    ck = load_checkpoint(checkpoint or run_dir / "best.pt", device)
    # an end-to-end run's backbone weights and the word embeddings are in the checkpoint: no pretrained file read
    build_cfg = {**cfg, "text": text_cfg_for_checkpoint(cfg["text"], ck["model"])}
    model = model_from_config(build_cfg, ck["image_dim"], ck["vocab_words"], pretrained_backbone=False).to(device)
    model.load_state_dict(ck["model"])
    return model.eval(), cfg


def score_split(run_dir: str | os.PathLike, split: str | None = None, device: str = "auto",
                progress: bool = True, select_elements: Callable | None = None,
                dataset: str | None = None) -> tuple[np.ndarray, dict]:
    """Similarity matrix (images x captions) of a trained run on ``split`` (default: the test split).
    ``select_elements(images, captions) -> (images, captions)`` leaves set elements out of the similarity (DivE
    Table 5, ``xmr score --image-elements``); the gallery cache and set statistics keep the whole sets.
    ``dataset``: another dataset's split (:func:`xmr.run.config.on_dataset`); the run directory's gallery cache is
    its own dataset's, so none is written, and the set statistics are stored under that dataset's name."""
    from xmr.run.config import on_dataset
    from xmr.run.gallery_cache import write_gallery

    dev = resolve_device(device)
    model, own = load_trained(run_dir, dev)
    cfg = on_dataset(own, dataset)
    split = split or cfg["dataset_cfg"]["test_split"]
    settings = run_settings(cfg)
    data, feats = load_split_images(settings.image, settings.dataset_config, split)
    t0 = time.time()
    img, cap = encode_split_of(model, settings, data, feats, dev, progress=progress)
    scored_img, scored_cap = select_elements(img, cap) if select_elements else (img, cap)
    with torch.no_grad():
        sims = model.similarity_matrix(scored_img.to(dev), scored_cap.to(dev)).float().cpu().numpy()
    dt = time.time() - t0
    log_line(f"score {split}", images=len(img), captions=len(cap), seconds=dt,
             items_per_s=(len(img) + len(cap)) / max(dt, 1e-9))
    info = {"split": split, "dataset": cfg["dataset"], "num_images": data.num_images,
            "num_captions": data.num_captions, "image_labels": data.image_labels}
    other = None if cfg is own else cfg["dataset"]
    if other is None:  # for xmr search / encode_split / xmr test
        write_gallery(run_dir, settings, split, data, img.numpy(), cap.numpy())
    if img.ndim == 3:  # a set method: how far apart its sub-embeddings are (xmr evaluate copies it into the results)
        from xmr.run.gallery_cache import write_set_statistics

        stats = compute_set_statistics(model, settings.image.max_regions, settings.validation.batch_size, data, feats,
                                       dev, img, cap)
        write_set_statistics(run_dir, settings, split, stats, other)
    return sims, info


@torch.no_grad()
def compute_set_statistics(model: RetrievalModel, max_regions: int | None, batch_size: int, data, feats,
                           device: torch.device, image_sets: torch.Tensor,
                           text: torch.Tensor | None = None) -> dict[str, Any]:
    """Set statistics of a trained model on a split, from the embeddings ``encode_split`` gave (``image_sets``
    (N, K, D) of the split's first N images, ``text`` their captions' embeddings, for slot usage). The images are
    encoded once more to read each batch's residuals and, for DVSE, the global term h_V(z) from its
    ``image_outputs``."""
    from xmr.evaluation.set_stats import SLOT_MEASURES, residual_key, set_statistics

    model.eval()
    n = image_sets.shape[0]
    dataset, collate = image_loader_parts(feats, list(range(n)), max_regions)
    loader = DataLoader(dataset, batch_size=batch_size, collate_fn=collate)
    res, g_norms, r_norms, batches = [], [], [], 0
    for b in loader:
        out = model.image_outputs(*model.image_local_features(*image_input(b, device)))
        batches += 1
        key = residual_key(out)
        if key is not None:
            res.append(out[key].float().cpu())
        if out.get("image_global") is not None:
            g_norms.append(out["image_global"].float().norm(dim=-1).cpu())
            r_norms.append(out["image_residuals"].float().norm(dim=-1).flatten().cpu())
    slots = model.scoring.similarity in SLOT_MEASURES and text is not None  # eval.similarity
    caption_image = [j for j in data.caption_image if j < n] if slots else None  # encode_split's captions
    if slots and len(caption_image) != len(text):
        raise XmrError(f"set statistics: {len(text)} caption embeddings for {len(caption_image)} captions")
    return set_statistics(image_sets, text if slots else None, caption_image,
                          torch.cat(res) if res and len(res) == batches else None,
                          torch.cat(g_norms).mean().item() if g_norms else None,
                          torch.cat(r_norms).mean().item() if r_norms else None)


def score_bank(run_dir: str | os.PathLike, bank_split: str = "train", max_images: int | None = 5000,
               device: str = "auto", progress: bool = True) -> tuple[np.ndarray, np.ndarray, dict]:
    """QB-Norm's query bank for a run's test split: queries that are not test queries (the first ``max_images``
    images of ``bank_split`` and their captions). Returns ``(bank_i2t, bank_t2i, info)``: bank images x test
    captions (bank image queries over the test captions) and test images x bank captions."""
    dev = resolve_device(device)
    model, cfg = load_trained(run_dir, dev)
    test_split = cfg["dataset_cfg"]["test_split"]
    if bank_split == test_split:
        raise XmrError(f"bank split {bank_split!r} is the test split; the bank must hold other queries (use "
                       f"train), or evaluate qbnorm with self_bank=1 for the transductive reading")
    settings = run_settings(cfg)
    bank_data, bank_images = load_split_images(settings.image, settings.dataset_config, bank_split)
    test_data, test_images = load_split_images(settings.image, settings.dataset_config, test_split)
    bank_img, bank_cap = encode_split_of(model, settings, bank_data, bank_images, dev, max_images, progress)
    test_img, test_cap = encode_split_of(model, settings, test_data, test_images, dev, progress=progress)
    with torch.no_grad():
        i2t = model.similarity_matrix(bank_img.to(dev), test_cap.to(dev)).float().cpu().numpy()
        t2i = model.similarity_matrix(test_img.to(dev), bank_cap.to(dev)).float().cpu().numpy()
    return i2t, t2i, {"bank_split": bank_split, "bank_images": len(bank_img), "bank_captions": len(bank_cap),
                      "test_images": len(test_img), "test_captions": len(test_cap)}


# -- the public API -----------------------------------------------------------------------------------------------

def _as_tensor(x: Any, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A user's array or tensor (any device) as a ``dtype`` tensor on ``device``: the public API takes both."""
    t = x.detach() if torch.is_tensor(x) else torch.as_tensor(np.asarray(x))
    return t.to(device=device, dtype=dtype)


def _as_array(x: torch.Tensor) -> np.ndarray:
    """What the public API returns: a float32 NumPy array on the CPU."""
    return x.detach().float().cpu().numpy()


def resolve_run(run: str | os.PathLike) -> tuple[Path, Path]:
    """``(run_dir, checkpoint)`` of a run directory, a checkpoint file inside one, or an MLflow run id (its
    ``best_checkpoint`` tag, set by the trainer; the store is ``$MLFLOW_TRACKING_URI`` or ``sqlite:///mlflow.db``)."""
    p = Path(run)
    if p.is_dir():
        return p, p / "best.pt"
    if p.is_file():
        return p.parent, p
    if p.suffix == ".pt" or os.sep in str(run):
        raise XmrError(f"{run}: no such run directory or checkpoint; train it first (`xmr train`)")
    from xmr.run.tracking import tracking_uri

    try:
        import mlflow

        mlflow.set_tracking_uri(tracking_uri())
        tags = mlflow.get_run(str(run)).data.tags
    except Exception as e:  # noqa: BLE001 - an unknown id or an unreachable store: one line for the user
        raise XmrError(f"{run}: not a run directory, checkpoint or MLflow run id in {tracking_uri()} "
                       f"({type(e).__name__})") from None
    ck = tags.get("best_checkpoint")
    if not ck or not Path(ck).is_file():
        raise XmrError(f"MLflow run {run}: its best_checkpoint tag ({ck or 'none'}) names no file on this machine; "
                       f"pass the run directory instead")
    return Path(ck).parent, Path(ck)


class Model:
    """A trained retrieval model for inference (eval mode, no optimizer): see :func:`xmr.load`.

    Arrays: every method returns NumPy arrays on the CPU (embeddings and scores float32, ``search``'s indices int64)
    and takes NumPy arrays or torch tensors (on any device, cast to float32) as input."""

    def __init__(self, model: RetrievalModel, cfg: dict, device: torch.device, run_dir: Path | None = None,
                 checkpoint: Path | None = None) -> None:
        self.model, self.cfg, self.device, self.run_dir = model.eval(), cfg, device, run_dir
        self.settings = run_settings(cfg)
        self.checkpoint = checkpoint
        self.batch_size = int(self.settings.validation.batch_size)
        self._backbone = None  # the run's feature extractor, built by the first image-file query and kept

    @property
    def method(self) -> str:
        return self.cfg["method"]

    def __repr__(self) -> str:
        where = self.run_dir if self.run_dir is not None else self.checkpoint
        return (f"Model(method={self.method!r}, name={self.cfg['name']!r}, dataset={self.cfg['dataset']!r}, "
                f"embed_dim={self.cfg['model'].get('embed_dim')}, device={str(self.device)!r}, from={str(where)!r})")

    # -- encoders -----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def encode_text(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings of free-text captions: float32 (B, D), or (B, K, D) for set-based methods."""
        from xmr.data.karpathy import tokenize_for

        if isinstance(texts, str):
            texts = [texts]
        if self.cfg["text"]["encoder"] == "precomputed":
            raise XmrError(f"{self.cfg['name']}: text.encoder is 'precomputed' (features computed offline per "
                           f"split), so free text cannot be encoded; use a run with a text encoder")
        vocab = set(getattr(getattr(self.model.text, "vocab", None), "words", ()))  # tokens as in training
        out = []
        for s in range(0, len(texts), self.batch_size):
            chunk = list(texts[s:s + self.batch_size])
            batch = self.model.text.collate(chunk, [tokenize_for(t, vocab) for t in chunk], None, None)
            out.append(self.model.encode_text(_to(batch, self.device)).float().cpu())
        return _as_array(torch.cat(out))

    def known_words(self, text: str) -> list[str] | None:
        """The words of ``text`` (tokenized as :meth:`encode_text` does) that the model's vocabulary holds; any
        other reads as ``<unk>``. None for a text encoder without a word vocabulary (BERT's word pieces spell any
        text)."""
        from xmr.data.karpathy import tokenize_for

        words = getattr(getattr(self.model.text, "vocab", None), "words", None)
        if not words:
            return None
        vocab = set(words)
        return [t for t in tokenize_for(text, vocab) if t.lower() in vocab]

    @torch.no_grad()
    def encode_image(self, images: Any = None, num_regions: Any = None, *, features: str | os.PathLike | None = None,
                     rows: Sequence[int] | None = None) -> np.ndarray:
        """Image embeddings, float32 (B, D) or (B, K, D) for set-based methods, from one of:

        - ``images``: precomputed features, a NumPy array or torch tensor (B, R, F) (``num_regions``: (B,) valid
          rows, default all) or (B, F);
        - ``features`` (+ ``rows``, default all): rows of a feature file written by ``xmr extract``;
        - ``images``: a list of image file paths, run through the configured backbone (the end-to-end model's
          own, or the run's ``backbone_cfg`` exactly as ``xmr extract`` runs it).
        """
        if features is not None:
            from xmr.features.store import FeatureFile

            ff = FeatureFile(features)
            idx = list(range(len(ff.image_ids))) if rows is None else [int(r) for r in rows]
            return _as_array(self._encode_feature_rows(ff, idx))
        if isinstance(images, (str, os.PathLike)):
            images = [images]
        if isinstance(images, (list, tuple)) and images and isinstance(images[0], (str, os.PathLike)):
            return _as_array(self._encode_files([Path(p) for p in images]))
        if images is None:
            raise XmrError("encode_image: pass features (array or feature file) or image file paths")
        x = _as_tensor(images, torch.device("cpu"))
        if x.ndim == 2:
            x = x.unsqueeze(1)
        if x.ndim != 3:
            raise XmrError(f"encode_image: features must be (B, R, F) or (B, F), got shape {tuple(x.shape)}")
        nr = (torch.full((len(x),), x.shape[1], dtype=torch.long) if num_regions is None
              else _as_tensor(num_regions, torch.device("cpu"), torch.long))
        out = []
        for s in range(0, len(x), self.batch_size):
            sl = slice(s, s + self.batch_size)
            out.append(self.model.encode_image(x[sl].to(self.device), nr[sl].to(self.device)).float().cpu())
        return _as_array(torch.cat(out))

    def _encode_feature_rows(self, ff, idx: list[int]) -> torch.Tensor:
        dataset, collate = image_loader_parts(ff, idx, self.settings.image.max_regions)
        out = []
        for b in DataLoader(dataset, batch_size=self.batch_size, collate_fn=collate):
            out.append(self.model.embed_images(*image_input(b, self.device)).float().cpu())
        return torch.cat(out)

    def _encode_files(self, paths: list[Path]) -> torch.Tensor:
        missing = [p for p in paths if not p.exists()]
        if missing:
            raise XmrError(f"{missing[0]}: image file not found")
        if self.settings.image.end_to_end:  # the fine-tuned backbone is part of the model
            from xmr.inference.loaders import ImageFiles

            prep = self.settings.image.preparation
            dataset, collate = image_loader_parts(ImageFiles(paths, prep.size, prep.resize, prep.max_size),
                                                  list(range(len(paths))))
            out = []
            for b in DataLoader(dataset, batch_size=self.batch_size, collate_fn=collate):
                out.append(self.model.embed_images(b["images"].to(self.device), None).float().cpu())
            return torch.cat(out)
        # precomputed features: the one extraction path (same resize, normalisation and dtype as `xmr extract`)
        from xmr.data.base import CaptionedSplit
        from xmr.features.extract import extract_features
        from xmr.features.store import FeatureFile

        if "backbone_cfg" not in self.cfg:
            raise XmrError(f"{self.cfg['name']}: the run names no backbone (features.backbone), so image files "
                           f"cannot be encoded; pass precomputed features")
        split = CaptionedSplit(name="query", split="query", image_ids=[str(i) for i in range(len(paths))],
                               image_paths=paths, captions=[], caption_image=np.zeros(0, dtype=np.int64))
        if self._backbone is None:
            from xmr.features.backbones import build_backbone

            self._backbone = build_backbone(self.cfg["backbone_cfg"]).for_extraction()  # folded once, kept
        with tempfile.TemporaryDirectory(prefix="xmr-query-") as tmp:
            h5 = extract_features(split, self.cfg["backbone_cfg"], Path(tmp) / "query.h5",
                                  batch_size=self.batch_size, workers=0, progress=None, device=str(self.device),
                                  backbone=self._backbone)
            ff = FeatureFile(h5, in_memory=True)
            return self._encode_feature_rows(ff, list(range(len(paths))))

    # -- scoring ------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def similarity(self, image_emb: np.ndarray | torch.Tensor, text_emb: np.ndarray | torch.Tensor) -> np.ndarray:
        """(N images, M texts) float32 scores under the method's own evaluation measure (as ``xmr score`` computes
        them); the embeddings as :meth:`encode_image` / :meth:`encode_text` give them, NumPy or torch."""
        img, txt = _as_tensor(image_emb, self.device), _as_tensor(text_emb, self.device)
        return _as_array(self.model.similarity_matrix(img, txt))

    def search(self, queries: Sequence[str] | np.ndarray | torch.Tensor, gallery: np.ndarray | torch.Tensor,
               k: int = 5, rerank: str | None = None, queries_are: str | None = None,
               rerank_params: dict | None = None,
               reference: np.ndarray | torch.Tensor | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` gallery items per query: ``(indices (Q, k) int64, scores (Q, k) float32)``, best first.

        ``queries``: caption strings (searched over a gallery of image embeddings), or embeddings from
        :meth:`encode_text` / :meth:`encode_image` with ``queries_are`` ``"text"`` or ``"image"`` (the gallery is
        then the other modality). ``rerank``: a registered re-ranker name (e.g. ``fr``, ``dsl``) applied to the
        query x gallery matrix with its default parameters (or ``rerank_params``). ``reference``: with ``rerank``,
        embeddings of the queries' modality (e.g. the split's captions, for caption queries) re-ranked together with
        the queries, as in evaluation: re-rankers normalise each gallery item's scores over the queries' side, which
        a handful of queries alone does not sample (one caption query makes every FR score 0)."""
        if not isinstance(queries, (torch.Tensor, np.ndarray)):
            queries, queries_are = self.encode_text(list(queries)), "text"
        if queries_are not in ("text", "image"):
            raise XmrError("search: with embeddings as queries, say queries_are='text' or 'image'")
        n_queries = len(queries)
        if rerank and reference is not None:  # the queries last, after the reference population
            queries = torch.cat([_as_tensor(reference, self.device), _as_tensor(queries, self.device)])
        if queries_are == "text":
            sims = self.similarity(gallery, queries)  # images x captions
        else:
            sims = self.similarity(queries, gallery)
        if rerank:
            from xmr.config.loader import load_array_params, rerank_params as resolve_rerank_params
            from xmr.rerank import rerank as apply_rerank

            ds = self.cfg["dataset_cfg"].get("rerank_defaults") or self.cfg.get("dataset")
            params = load_array_params(resolve_rerank_params(rerank, ds, self.cfg["eval"]["rerank"], rerank_params),
                                       rerank)
            i2t, t2i = apply_rerank(sims, rerank, params)
            scores = t2i.T if queries_are == "text" else i2t
            scores = _as_array(scores) if torch.is_tensor(scores) else np.asarray(scores, dtype=np.float32)
        else:
            scores = sims.T if queries_are == "text" else sims
        scores = scores[-n_queries:]
        k = min(int(k), scores.shape[1])
        idx = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        return idx, np.take_along_axis(scores, idx, axis=1)

    def encode_split(self, split: str | None = None, dataset: str | None = None) -> dict[str, Any]:
        """A split of the run's dataset as a gallery: ``image_ids``, ``image_paths`` (the image files, or None
        for a features-only dataset), ``image_emb``, ``captions`` (with ``caption_image``: the index of each
        caption's image), ``text_emb`` (the embeddings as float32 NumPy arrays, as :meth:`encode_image` /
        :meth:`encode_text` give them). A run's own model (its
        ``best.pt``) reads the embeddings cached in the run directory (:mod:`xmr.run.gallery_cache`), and computes and
        caches them when the cache is missing or stale. ``dataset``: another dataset's split, as ``xmr score
        --dataset`` reads it (:func:`xmr.run.config.on_dataset`; not cached)."""
        from xmr.run.config import on_dataset
        from xmr.run.gallery_cache import read_gallery, write_gallery

        cfg = on_dataset(self.cfg, dataset)
        settings = self.settings if cfg is self.cfg else run_settings(cfg)
        split = split or cfg["dataset_cfg"]["test_split"]
        cacheable = self.run_dir is not None and self.checkpoint is not None and cfg is self.cfg \
            and Path(self.checkpoint).resolve() == (Path(self.run_dir) / "best.pt").resolve()
        cached = read_gallery(self.run_dir, settings, split) if cacheable else None
        if cached is not None:
            return {"split": split, "image_ids": cached["image_ids"], "image_paths": cached["image_paths"],
                    "captions": cached["captions"],
                    "caption_image": cached["caption_image"], "image_emb": cached["image_emb"],
                    "text_emb": cached["text_emb"]}
        data, feats = load_split_images(settings.image, settings.dataset_config, split)
        img, cap = encode_split_of(self.model, settings, data, feats, self.device)
        if cacheable:
            write_gallery(self.run_dir, settings, split, data, img.numpy(), cap.numpy())
        return {"split": split, "image_ids": list(data.image_ids),
                "image_paths": [str(p) for p in data.image_paths] or None, "image_emb": _as_array(img),
                "captions": list(data.captions), "caption_image": [int(i) for i in data.caption_image],
                "text_emb": _as_array(cap)}


def load(run: str | os.PathLike, device: str = "auto") -> Model:
    """A trained model for inference from a run directory, a checkpoint path or an MLflow run id."""
    run_dir, ck = resolve_run(run)
    dev = resolve_device(device)
    model, cfg = load_trained(run_dir, dev, checkpoint=ck)
    return Model(model, cfg, dev, run_dir, ck)
