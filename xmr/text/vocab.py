"""Word vocabulary for the BiGRU text encoders (built from the training captions only)."""

from __future__ import annotations

import os
from collections import Counter
from typing import Iterable

from xmr.core.errors import XmrError
from xmr.core.io import read_json, write_json

PAD, UNK, START, END = "<pad>", "<unk>", "<start>", "<end>"
SPECIALS = [PAD, UNK, START, END]


def nltk_tokenize(caption: str) -> list[str]:
    """``nltk.word_tokenize(caption.lower())`` as the VSE++/VSE∞ BiGRU models were built (``text.tokenizer:
    nltk``); ``preserve_line=True`` skips punkt's sentence splitter (its data is a download), which gives the same
    tokens for one-sentence captions."""
    try:
        from nltk.tokenize import word_tokenize
    except ImportError:
        raise XmrError("text.tokenizer: nltk needs `pip install nltk` (requirements.txt)") from None
    return word_tokenize(caption.lower(), preserve_line=True)


class Vocabulary:
    def __init__(self, words: list[str]) -> None:
        if words[: len(SPECIALS)] != SPECIALS:
            raise XmrError(f"vocabulary must start with {SPECIALS}")
        self.words = words
        self.index = {w: i for i, w in enumerate(words)}

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, tokens: Iterable[str], add_boundaries: bool = True) -> list[int]:
        unk = self.index[UNK]
        ids = [self.index.get(t.lower(), unk) for t in tokens]
        return [self.index[START], *ids, self.index[END]] if add_boundaries else ids

    @classmethod
    def build(cls, token_lists: Iterable[list[str]], min_count: int = 1) -> "Vocabulary":
        counts = Counter(t.lower() for toks in token_lists for t in toks)
        words = sorted(w for w, c in counts.items() if c >= min_count and w not in SPECIALS)
        return cls(SPECIALS + words)

    def save(self, path: str | os.PathLike) -> None:
        write_json(path, {"words": self.words})

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Vocabulary":
        doc = read_json(path)
        if "words" not in doc:
            raise XmrError(f"{path}: not an xmr vocabulary (no 'words' list); rebuild it with `xmr vocab`")
        return cls(doc["words"])
