"""HGLMM Fisher-vector caption features (Klein et al., CVPR 2015), the text input of RRF-Net and DSPE.

Pipeline (method card 004 §2.2, §10): word vectors (L2-normalised) -> ICA (D -> D) -> hybrid
Gaussian-Laplacian mixture model fitted with EM (per component and dimension either a Gaussian or a
Laplacian, whichever fits better) -> per caption, the Fisher vector = normalised gradients of the mean word
log-likelihood w.r.t. the locations and scales (2 K D numbers) -> signed square root + L2 -> PCA (centred,
not whitened), fitted on the training captions.

Everything fitted is one :class:`HGLMMModel` saved as an ``.npz`` of plain arrays; ``xmr text-features``
writes ``features/{dataset}/hglmm/{split}.h5`` with it (layout in :func:`write_text_features`). The settings
live in ``config/text_features.yaml`` (thesis values, with small per-dataset overrides for ``synth``).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch

from xmr.core.errors import XmrError
from xmr.core.io import atomic_path
from xmr.text.hybrid_mixture import FV_NORMS, HybridMixture

LAYOUT_VERSION = 1

#: JSON schema of one entry of ``config/text_features.yaml`` (kind ``hglmm``), with the thesis defaults.
HGLMM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "kind": {"const": "hglmm", "default": "hglmm"},
        "description": {"type": "string"},
        "word_vectors": {"type": "string", "default": "resources/word_vectors/GoogleNews-vectors-negative300.bin",
                         "description": "glove6b50d (shipped), a word2vec .bin, or a GloVe/word2vec text file"},
        "normalize_words": {"type": "boolean", "default": True, "description": "L2-normalise word vectors [K]"},
        "fit_on": {"enum": ["vocab", "train_captions"], "default": "vocab",
                   "description": "vocab: a sample of the word-vector vocabulary [K]; train_captions: the "
                                  "training captions' tokens, frequency-weighted"},
        "vocab_limit": {"type": "integer", "minimum": 1, "default": 1000000,
                        "description": "fit_on=vocab samples among the first N (most frequent) entries"},
        "fit_samples": {"type": "integer", "minimum": 2, "default": 300000},
        "ica": {"type": "boolean", "default": True, "description": "FastICA D -> D before the mixture [K]"},
        "ica_max_iter": {"type": "integer", "minimum": 1, "default": 1000},
        "scale": {"type": "number", "exclusiveMinimum": 0, "default": 1.0,
                  "description": "multiplies the (post-ICA) vectors before EM and FV (Klein's README: 10 if EM "
                                 "misbehaves on tiny values)"},
        "components": {"type": "integer", "minimum": 1, "default": 30},
        "em_iterations": {"type": "integer", "minimum": 1, "default": 100},
        "em_tol": {"type": "number", "minimum": 0, "default": 1e-5,
                   "description": "stop when the relative change of the mean log-likelihood is below this"},
        "min_variance": {"type": "number", "exclusiveMinimum": 0, "default": 1e-3},
        "min_scale": {"type": "number", "exclusiveMinimum": 0, "default": 1e-3},
        "fv_norm": {"enum": list(FV_NORMS), "default": "power_l2",
                    "description": "power_l2: signed sqrt then L2 ('improved FV'); l2; none"},
        "pca_dim": {"type": ["integer", "null"], "minimum": 1, "default": 6000,
                    "description": "null keeps the 2 K D Fisher vector"},
        "dtype": {"enum": ["float32", "float16"], "default": "float32", "description": "storage dtype"},
        "seed": {"type": "integer", "default": 0},
    },
}
#: Settings that do not change the fitted model (excluded when deciding whether a saved model is reusable).
RUNTIME_KEYS = ("description", "dtype")


def default_settings() -> dict[str, Any]:
    return {k: v["default"] for k, v in HGLMM_SCHEMA["properties"].items() if "default" in v}


def load_text_feature_settings(kind: str, dataset: str, config_dir: str | os.PathLike = "config",
                               overrides: Iterable[str] = ()) -> dict[str, Any]:
    """Settings of ``kind`` from ``config/text_features.yaml``: the entry, then its ``datasets.{dataset}``
    block, then ``key=value`` overrides; validated with defaults filled."""
    from xmr.config.loader import load_yaml, parse_assignments, validate

    path = Path(config_dir) / "text_features.yaml"
    table = load_yaml(path)
    if kind not in table:
        raise XmrError(f"{path}: no text-feature kind {kind!r}; known: {', '.join(sorted(table)) or 'none'}")
    entry = dict(table[kind] or {})
    per_dataset = entry.pop("datasets", {}) or {}
    settings = {**entry, **(per_dataset.get(dataset) or {})}
    settings.update(parse_assignments(overrides, "--set"))
    if settings.get("kind", "hglmm") != "hglmm":
        raise XmrError(f"{path}: {kind}.kind: only 'hglmm' is implemented, got {settings['kind']!r}")
    return validate(settings, HGLMM_SCHEMA, f"{path}:{kind} (dataset {dataset})")


# -- words ----------------------------------------------------------------------------------------------

_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")


def caption_words(caption: str) -> list[str]:
    """Word tokens of a raw caption: letters (with an inner apostrophe); punctuation and numbers dropped."""
    return _WORD.findall(caption)


def token_variants(token: str) -> list[str]:
    """Lookup order [card §10.2]: as written, lower case, Capitalised (word2vec is case-sensitive)."""
    out = [token]
    for v in (token.lower(), token.capitalize()):
        if v not in out:
            out.append(v)
    return out


def read_vectors(spec: str, head: int = 0, wanted: set[str] | None = None
                 ) -> tuple[dict[str, int], np.ndarray, list[str]]:
    """Word vectors from ``spec`` (``glove6b50d``, a word2vec ``.bin``, or a GloVe/word2vec text file):
    the first ``head`` entries (most frequent first in all these files) plus the ``wanted`` words."""
    from xmr.text.word_vectors import (is_word2vec_binary, load_word_vectors, read_text_vectors,
                                       read_word2vec_binary)

    wanted = set(wanted or ())
    if spec == "glove6b50d":
        index, mat = load_word_vectors(spec, None)
        words = list(index)  # insertion order = file (frequency) order
        head_words = words[:head]
        keep = head_words + [w for w in wanted if w in index and index[w] >= head]
        sub = np.asarray(mat[[index[w] for w in keep]], dtype=np.float32)
        return {w: i for i, w in enumerate(keep)}, sub, head_words
    if not Path(spec).exists():
        raise XmrError(f"word_vectors {spec}: file not found; give `glove6b50d` or a local word2vec .bin / "
                       f"GloVe .txt path in config/text_features.yaml (GoogleNews vectors: README 'Datasets')")
    if is_word2vec_binary(spec):
        return read_word2vec_binary(spec, wanted, head)
    head_words: list[str] = []
    if head:
        with open(spec, encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f):
                parts = line.split(" ", 2)
                if lineno == 0 and len(parts) == 2 and all(p.strip().isdigit() for p in parts):
                    continue  # word2vec text header
                head_words.append(parts[0])
                if len(head_words) >= head:
                    break
    index, mat = read_text_vectors(spec, wanted | set(head_words))
    return index, mat, [w for w in head_words if w in index]


def l2_normalize_rows(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(n, 1e-12)


# -- the whole text-feature model ----------------------------------------------------------------------

@dataclass
class HGLMMModel:
    """ICA + mixture + PCA, plus the settings they were fitted with. Saved as plain arrays (``.npz``)."""

    settings: dict[str, Any]
    ica_mean: np.ndarray       # (D,)
    ica_matrix: np.ndarray     # (D, D): y = (x - mean) @ ica_matrix.T (identity when ica is off)
    mixture: HybridMixture
    pca_mean: np.ndarray | None = None        # (2KD,)
    pca_components: np.ndarray | None = None  # (P, 2KD), rows = principal axes
    pca_eigenvalues: np.ndarray | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def out_dim(self) -> int:
        return self.mixture.fv_dim if self.pca_components is None else self.pca_components.shape[0]

    def word_space(self, vectors: np.ndarray) -> np.ndarray:
        """Raw word vectors -> the mixture's space (normalise, ICA, scale)."""
        v = np.asarray(vectors, dtype=np.float64)
        if self.settings["normalize_words"]:
            v = l2_normalize_rows(v)
        return (v - self.ica_mean) @ self.ica_matrix.T * self.settings["scale"]

    def fisher_vectors(self, words: np.ndarray, caption_of_word: np.ndarray, num_captions: int,
                       device: str | torch.device = "cpu") -> torch.Tensor:
        return self.mixture.fisher_vectors(words, caption_of_word, num_captions, self.settings["fv_norm"], device)

    def project(self, fv: torch.Tensor) -> torch.Tensor:
        if self.pca_components is None:
            return fv
        mean = torch.as_tensor(self.pca_mean, dtype=fv.dtype, device=fv.device)
        comp = torch.as_tensor(self.pca_components, dtype=fv.dtype, device=fv.device)
        return (fv - mean) @ comp.t()

    # -- persistence ------------------------------------------------------------------------------------
    def arrays(self) -> dict[str, np.ndarray]:
        m = self.mixture
        out = {"ica_mean": self.ica_mean, "ica_matrix": self.ica_matrix, "weights": m.weights, "mean": m.mean,
               "var": m.var, "loc": m.loc, "scale": m.scale, "gaussian": m.gaussian}
        if self.pca_components is not None:
            out.update(pca_mean=self.pca_mean, pca_components=self.pca_components,
                       pca_eigenvalues=self.pca_eigenvalues)
        return out

    def checksum(self) -> str:
        """SHA-256 over the settings and the arrays' bytes (independent of the npz container)."""
        h = hashlib.sha256(json.dumps(model_identity(self.settings), sort_keys=True).encode())
        for k, v in sorted(self.arrays().items()):
            a = np.ascontiguousarray(v)
            h.update(f"{k}:{a.dtype.str}:{a.shape}".encode())
            h.update(a.tobytes())
        return h.hexdigest()

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        with atomic_path(path, ".npz") as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, settings_json=np.asarray(json.dumps(self.settings, sort_keys=True)),
                         info_json=np.asarray(json.dumps(self.info, sort_keys=True)), **self.arrays())
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "HGLMMModel":
        path = Path(path)
        if not path.exists():
            raise XmrError(f"{path}: HGLMM model not found; fit it with `xmr text-features ... --fit-split train`")
        try:
            z = np.load(path, allow_pickle=False)
            arrays = {k: z[k] for k in z.files}
        except (OSError, ValueError) as e:
            raise XmrError(f"{path}: cannot read the HGLMM model ({e}); delete it and fit again") from None
        need = {"settings_json", "ica_mean", "ica_matrix", "weights", "mean", "var", "loc", "scale", "gaussian"}
        if not need <= set(arrays):
            raise XmrError(f"{path}: not an HGLMM model (missing {sorted(need - set(arrays))}); fit it again")
        mix = HybridMixture(*(arrays[k] for k in ("weights", "mean", "var", "loc", "scale", "gaussian")))
        return cls(settings=json.loads(str(arrays["settings_json"])), ica_mean=arrays["ica_mean"],
                   ica_matrix=arrays["ica_matrix"], mixture=mix, pca_mean=arrays.get("pca_mean"),
                   pca_components=arrays.get("pca_components"), pca_eigenvalues=arrays.get("pca_eigenvalues"),
                   info=json.loads(str(arrays.get("info_json", "{}"))))


def model_identity(settings: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in settings.items() if k not in RUNTIME_KEYS}


# -- captions -> word rows -------------------------------------------------------------------------------

@dataclass
class CaptionWords:
    """The in-vocabulary words of a list of captions, flattened: word ``i`` is ``vocab[word_row[i]]`` and
    belongs to caption ``caption_of_word[i]``."""

    word_row: np.ndarray
    caption_of_word: np.ndarray
    num_captions: int
    empty_captions: int
    oov_tokens: int
    tokens: int


def caption_words_index(captions: list[str], index: dict[str, int]) -> CaptionWords:
    rows, owner = [], []
    empty = oov = total = 0
    for j, cap in enumerate(captions):
        found = 0
        for tok in caption_words(cap):
            total += 1
            r = next((index[v] for v in token_variants(tok) if v in index), None)
            if r is None:
                oov += 1  # OOV tokens are skipped (GoogleNews lacks "a", "and", "of", ...) [card §10.2]
                continue
            rows.append(r)
            owner.append(j)
            found += 1
        empty += found == 0
    return CaptionWords(np.asarray(rows, dtype=np.int64), np.asarray(owner, dtype=np.int64), len(captions),
                        empty, oov, total)


def wanted_words(captions: Iterable[str]) -> set[str]:
    return {v for c in captions for t in caption_words(c) for v in token_variants(t)}


def iter_caption_chunks(words: CaptionWords, chunk: int) -> Iterable[tuple[int, int, np.ndarray, np.ndarray]]:
    """(start, stop, word_rows, caption_of_word relative to start) per block of ``chunk`` captions."""
    bounds = np.searchsorted(words.caption_of_word, np.arange(0, words.num_captions + chunk, chunk))
    for b, start in enumerate(range(0, words.num_captions, chunk)):
        lo, hi = bounds[b], bounds[b + 1]
        yield start, min(start + chunk, words.num_captions), words.word_row[lo:hi], words.caption_of_word[lo:hi] - start


def _chunk_for(fv_dim: int, words_per_caption: float) -> int:
    # keep the (words, K, D) float64 temporaries of one chunk near 256 MB
    return int(max(16, min(4096, (1 << 25) / max(1.0, fv_dim / 2 * max(1.0, words_per_caption)))))


def _device(device: str | torch.device) -> torch.device:
    from xmr.core.utils import resolve_device

    return resolve_device(device) if isinstance(device, str) else device


def fit_hglmm(settings: dict[str, Any], train_captions: list[str], device: str | torch.device = "auto",
              progress: bool = True) -> HGLMMModel:
    """Fit word-vector ICA, the mixture and the PCA on a dataset's training captions (settings validated by
    :func:`load_text_feature_settings`)."""
    from sklearn.decomposition import FastICA
    from sklearn.exceptions import ConvergenceWarning

    s = settings
    dev = _device(device)
    rng = np.random.default_rng(s["seed"])
    head = s["vocab_limit"] if s["fit_on"] == "vocab" else 0
    index, mat, head_words = read_vectors(s["word_vectors"], head, wanted_words(train_captions))
    words = caption_words_index(train_captions, index)
    if len(words.word_row) == 0:
        raise XmrError(f"word_vectors {s['word_vectors']}: no training-caption word is in the vocabulary")
    if s["fit_on"] == "vocab":
        # plausible word tokens only (no phrases "New_York", punctuation, numbers) [card §10.3]
        cand = np.asarray([index[w] for w in head_words if w.isalpha()], dtype=np.int64)
    else:
        cand = words.word_row  # every occurrence: frequency-weighted
    if len(cand) < 2:
        raise XmrError(f"word_vectors {s['word_vectors']}: too few fitting vectors ({len(cand)})")
    pick = cand if len(cand) <= s["fit_samples"] else cand[np.sort(rng.choice(len(cand), s["fit_samples"],
                                                                              replace=False))]
    sample = np.asarray(mat[pick], dtype=np.float64)
    if s["normalize_words"]:
        sample = l2_normalize_rows(sample)
    D = sample.shape[1]
    if s["ica"] and len(np.unique(pick)) <= D:
        raise XmrError(f"hglmm: ICA needs more than {D} distinct fitting vectors, got {len(np.unique(pick))}; "
                       f"use fit_on: vocab, raise fit_samples, or set ica: false")
    if s["ica"]:
        if progress:
            print(f"hglmm: FastICA {D} -> {D} on {len(sample)} word vectors")
        ica = FastICA(n_components=D, whiten="unit-variance", random_state=s["seed"], max_iter=s["ica_max_iter"])
        with warnings.catch_warnings():
            # a not fully converged unmixing is still an invertible whitening transform: record it, don't warn
            warnings.simplefilter("ignore", ConvergenceWarning)
            ica.fit(sample)
        ica_mean, ica_matrix = ica.mean_.astype(np.float64), ica.components_.astype(np.float64)
        ica_info = {"ica_iterations": int(ica.n_iter_), "ica_converged": bool(ica.n_iter_ < s["ica_max_iter"])}
        if progress and not ica_info["ica_converged"]:
            print(f"hglmm: FastICA stopped at ica_max_iter={s['ica_max_iter']} before converging")
    else:
        ica_mean, ica_matrix, ica_info = np.zeros(D), np.eye(D), {}
    # the mixture is fitted in the space this partial model maps words into
    model = HGLMMModel(settings=dict(s), ica_mean=ica_mean, ica_matrix=ica_matrix, mixture=None)  # type: ignore
    z = model.word_space(mat[pick])
    if progress:
        print(f"hglmm: EM, {s['components']} components on {len(z)} vectors")
    model.mixture, em_info = HybridMixture.fit(z, s["components"], s["em_iterations"], s["em_tol"], s["seed"],
                                               s["min_variance"], s["min_scale"], dev, progress=progress)
    fv_dim = model.mixture.fv_dim
    if s["pca_dim"] is not None:
        if s["pca_dim"] > fv_dim:
            raise XmrError(f"pca_dim {s['pca_dim']} exceeds the Fisher-vector size 2*{s['components']}*{D} = "
                           f"{fv_dim}; lower pca_dim or set it to null")
        # streaming covariance of the training-caption FVs (never materialise all 2KD-d vectors) [card §10.6]
        space = torch.as_tensor(model.word_space(mat), dtype=torch.float64, device=dev)
        total = torch.zeros(fv_dim, dtype=torch.float64, device=dev)
        gram = torch.zeros(fv_dim, fv_dim, dtype=torch.float64, device=dev)
        chunk = _chunk_for(fv_dim, len(words.word_row) / max(1, words.num_captions))
        for start, stop, rows, owner in iter_caption_chunks(words, chunk):
            fv = model.fisher_vectors(space[torch.as_tensor(rows, device=dev)], owner, stop - start, dev)
            total += fv.sum(0)
            gram += fv.t() @ fv
        m = words.num_captions
        mean = total / m
        cov = gram / m - torch.outer(mean, mean)
        evals, evecs = torch.linalg.eigh(cov)
        top = torch.argsort(evals, descending=True)[: s["pca_dim"]]
        comp = evecs[:, top].t()
        # fixed sign per axis (largest-magnitude entry positive) so refits on other hardware agree
        sign = torch.sign(comp.gather(1, comp.abs().argmax(1, keepdim=True)))
        comp = comp * torch.where(sign == 0, torch.ones_like(sign), sign)
        model.pca_mean = mean.cpu().numpy()
        model.pca_components = comp.cpu().numpy().astype(np.float32)
        model.pca_eigenvalues = evals[top].cpu().numpy()
        em_info["pca_explained"] = float(evals[top].sum() / evals.clamp(min=0).sum().clamp(min=1e-30))
    model.info = {**em_info, **ica_info, "train_captions": words.num_captions,
                  "train_empty_captions": words.empty_captions, "train_oov_tokens": words.oov_tokens,
                  "train_tokens": words.tokens, "fit_candidates": int(len(cand))}
    return model


def transform_captions(model: HGLMMModel, captions: list[str], device: str | torch.device = "auto",
                       progress: bool = False) -> tuple[np.ndarray, CaptionWords]:
    """(M, out_dim) float32 features of ``captions`` with a fitted model; also the word statistics."""
    from tqdm import tqdm

    dev = _device(device)
    index, mat, _ = read_vectors(model.settings["word_vectors"], 0, wanted_words(captions))
    words = caption_words_index(captions, index)
    space = torch.as_tensor(model.word_space(mat) if len(mat) else np.zeros((0, model.mixture.dim)),
                            dtype=torch.float64, device=dev)
    out = np.zeros((len(captions), model.out_dim), dtype=np.float32)
    chunk = _chunk_for(model.mixture.fv_dim, len(words.word_row) / max(1, words.num_captions))
    for start, stop, rows, owner in tqdm(list(iter_caption_chunks(words, chunk)), desc="fisher vectors",
                                         unit="chunk", disable=not progress):
        fv = model.fisher_vectors(space[torch.as_tensor(rows, device=dev)], owner, stop - start, dev)
        out[start:stop] = model.project(fv).cpu().numpy()
    return out, words


def write_text_features(path: str | os.PathLike, features: np.ndarray, captions: list[str],
                        caption_image: np.ndarray, image_ids: list[str], attrs: dict[str, Any],
                        dtype: str = "float32") -> Path:
    """HDF5 text-feature file (``LAYOUT_VERSION`` 1)::

        features       (M, F) float32|float16   one row per caption, in the split's caption order
        caption_index  (M,)   int64             the caption's index in the split (row j = caption j)
        caption_image  (M,)   int64             its image's index in the split
        captions       (M,)   utf-8 str         the raw captions (consumers check alignment with them)
        image_ids      (N,)   utf-8 str
        attrs: kind, dataset, split, word_vectors, components, pca_dim, fv_dim, model_sha256, settings (JSON),
               empty_captions, oov_tokens, tokens, layout_version, xmr_version, created
    """
    import h5py

    from xmr import __version__

    path = Path(path)
    m, f_dim = features.shape
    with atomic_path(path, ".h5") as tmp:
        with h5py.File(tmp, "w") as f:
            # row chunks: training reads random caption rows
            f.create_dataset("features", data=features.astype(dtype), chunks=(1, f_dim) if m else None)
            f.create_dataset("caption_index", data=np.arange(m, dtype=np.int64))
            f.create_dataset("caption_image", data=np.asarray(caption_image, dtype=np.int64))
            f.create_dataset("captions", data=np.asarray(captions, dtype=object), dtype=h5py.string_dtype("utf-8"))
            f.create_dataset("image_ids", data=np.asarray(image_ids, dtype=object), dtype=h5py.string_dtype("utf-8"))
            f.attrs.update({k: v for k, v in attrs.items() if v is not None})
            f.attrs["layout_version"] = LAYOUT_VERSION
            f.attrs["xmr_version"] = __version__
            f.attrs["created"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return path


def compute_text_features(dataset_cfg: dict, kind: str, settings: dict[str, Any], out_dir: str | os.PathLike,
                          splits: list[str], fit_split: str | None = None, refit: bool = False,
                          device: str = "auto", progress: bool = True) -> dict[str, Any]:
    """Fit (or reuse) ``{out_dir}/model.npz`` on ``fit_split`` and write ``{out_dir}/{split}.h5`` per split."""
    import time

    from xmr.data import load_split

    out_dir = Path(out_dir)
    model_path = out_dir / "model.npz"
    report: dict[str, Any] = {"model": str(model_path), "splits": {}}
    model = None
    if model_path.exists() and not refit:
        model = HGLMMModel.load(model_path)
        if model_identity(model.settings) != model_identity(settings):
            diff = sorted(k for k in set(model.settings) | set(settings)
                          if k not in RUNTIME_KEYS and model.settings.get(k) != settings.get(k))
            raise XmrError(f"{model_path}: fitted with different settings ({', '.join(diff)}); delete it or "
                           f"pass --refit (then recompute every split)")
        if progress:
            print(f"reusing {model_path}")
    if model is None:
        if fit_split is None:
            raise XmrError(f"{model_path}: no fitted model; pass --fit-split train to fit one")
        t0 = time.time()
        train = load_split(dataset_cfg, fit_split)
        model = fit_hglmm(settings, train.captions, device, progress)
        model.info["fit_split"] = fit_split
        model.info["fit_seconds"] = time.time() - t0
        model.save(model_path)
        report["fit_seconds"] = model.info["fit_seconds"]
        if progress:
            print(f"wrote {model_path} ({model.out_dim}-d, {model.info['fit_seconds']:.1f} s)")
    sha = model.checksum()
    for split in splits:
        t0 = time.time()
        data = load_split(dataset_cfg, split)
        feats, words = transform_captions(model, data.captions, device, progress)
        out = out_dir / f"{split}.h5"
        write_text_features(out, feats, data.captions, data.caption_image, data.image_ids, {
            "kind": kind, "dataset": dataset_cfg["name"], "split": split, "word_vectors": settings["word_vectors"],
            "components": settings["components"], "pca_dim": settings["pca_dim"] or 0,
            "fv_dim": model.mixture.fv_dim, "model_sha256": sha, "settings": json.dumps(settings, sort_keys=True),
            "empty_captions": words.empty_captions, "oov_tokens": words.oov_tokens, "tokens": words.tokens,
        }, settings["dtype"])
        report["splits"][split] = {"path": str(out), "captions": len(data.captions), "dim": feats.shape[1],
                                   "empty_captions": words.empty_captions, "seconds": time.time() - t0}
        if progress:
            print(f"wrote {out} ({len(data.captions)} x {feats.shape[1]}, {words.empty_captions} captions "
                  f"without an in-vocabulary word, {time.time() - t0:.1f} s)")
    return report
