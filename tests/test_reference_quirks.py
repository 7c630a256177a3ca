"""Released-code quirks that make a caption's embedding depend on its batch, each a named option.

DivE (kdwonn/DivE): the slot-axis softmax leaves padded inputs 1/K of attention (``model.pad_mode: code``), and the
text positions are normalised by the padded batch length (``model.text_pos_length: batch``). VSE+2AD
(96-Zachary/vse_2ad ``modules/adcap.py``): the token-level softmax runs over the padded rows too
(``model.adpool.mask_pad_in_token_softmax: false``). Hand-built batch: caption 0 encoded alone, and encoded beside
a longer caption (so it gets padding). With the code's reading its embedding changes; with the paper's it does not.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.fixtures.checkpoints.seeded import resolved_run_config
from xmr.inference.model import model_from_config

WORDS = ["<pad>", "<unk>", "<start>", "<end>", "a", "dog", "runs", "on", "the", "grass", "near", "red", "house"]
SHORT = [2, 4, 5, 6, 3]  # <start> a dog runs <end>
LONG = [2, 4, 5, 6, 7, 8, 9, 10, 4, 11, 12, 3]


def batch(*captions: list[int]) -> dict:
    lengths = torch.tensor([len(c) for c in captions])
    ids = torch.zeros(len(captions), int(lengths.max()), dtype=torch.long)
    for i, c in enumerate(captions):
        ids[i, : len(c)] = torch.tensor(c)
    return {"ids": ids, "lengths": lengths}


def caption_alone_and_padded(tmp_path, method: str, model_cfg: dict) -> tuple[torch.Tensor, torch.Tensor]:
    cfg = resolved_run_config(f"methods/{method}.yaml", tmp_path, {
        "dataset": "synth", "features": {"backbone": "efficientnet_lite0"}, "model": {"embed_dim": 16, **model_cfg},
        "text": {"word_vectors": None, "word_dim": 8}})
    torch.manual_seed(0)
    model = model_from_config(cfg, 6, WORDS).eval()
    with torch.no_grad():
        alone = model.encode_text(batch(SHORT))[0]
        padded = model.encode_text(batch(SHORT, LONG))[0]
    return alone, padded


DIVE = {"heads": 2, "dim_head": 4, "iterations": 2, "dropout": 0.0}


@pytest.mark.parametrize("reading,expect_change", [
    ({"pad_mode": "zero", "text_pos_length": "caption"}, False),  # the defaults (paper)
    ({"pad_mode": "code", "text_pos_length": "caption"}, True),   # the code's 1/K attention to padding
    ({"pad_mode": "zero", "text_pos_length": "batch"}, True),     # the code's positions over the padded length
])
def test_dive_caption_embedding_and_the_batch_padding(tmp_path, one_thread, reading, expect_change):
    alone, padded = caption_alone_and_padded(tmp_path, "dive", {**DIVE, **reading})
    diff = (alone - padded).abs().max().item()
    if expect_change:
        assert diff > 1e-3
    else:
        assert diff < 1e-6


def test_dive_batch_positions_are_the_released_code_formula():
    """PositionEmbeddingSine1D(normalize=True): cumsum of ones (1..T) / (T + 1e-6) · 2π, for every row."""
    from xmr.models.slot_attention import sine_positions_1d

    pos = sine_positions_1d(torch.tensor([2, 4]), 4, 2, "batch")
    angle = torch.tensor([1.0, 2.0, 3.0, 4.0]) / (4 + 1e-6) * 2 * torch.pi
    expected = torch.stack([angle.sin(), angle.cos()], dim=-1)  # dim 2: one frequency, ω = 1
    torch.testing.assert_close(pos, expected.expand(2, -1, -1), rtol=0, atol=1e-6)
    own = sine_positions_1d(torch.tensor([2, 4]), 4, 2, "caption")
    torch.testing.assert_close(own[0, :2, 0], torch.tensor([0.0, torch.pi]).sin(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("mask_pad,expect_change", [(False, True), (True, False)])
def test_vse_2ad_token_softmax_and_the_batch_padding(tmp_path, one_thread, mask_pad, expect_change):
    alone, padded = caption_alone_and_padded(tmp_path, "vse_2ad", {"adpool": {"mask_pad_in_token_softmax": mask_pad}})
    diff = (alone - padded).abs().max().item()
    if expect_change:
        assert diff > 1e-3
    else:
        assert diff < 1e-6


# DivE's caption side as kdwonn/DivE has it, from the method file every DivE recipe extends (no option to set)
DIVE_RECIPES = sorted(str(p.relative_to(p.parents[2])) for p in
                      (Path(__file__).resolve().parents[1] / "config" / "recipes").glob("*/dive*.yaml"))


def dive_recipe_model(tmp_path, recipe: str, **layers: dict) -> torch.nn.Module:
    cfg = resolved_run_config(recipe, tmp_path, {
        "dataset": "synth", "features": {"backbone": "efficientnet_lite0"}, "model": {"embed_dim": 16, **DIVE},
        "text": {"word_vectors": None, "word_dim": 8, "encoder": "bigru"}}, *layers.values())
    torch.manual_seed(0)
    return model_from_config(cfg, 6, WORDS)


@pytest.mark.parametrize("recipe", DIVE_RECIPES)
def test_dive_recipes_number_words_over_the_padded_batch(tmp_path, one_thread, recipe):
    """kdwonn/DivE's PositionEmbeddingSine1D runs over the padded batch length: with attention to padding switched
    off (pad_mode zero), a caption's embedding still changes when a longer caption pads it; it fails if a DivE
    recipe goes back to the caption's own length."""
    model = dive_recipe_model(tmp_path, recipe, off={"model": {"pad_mode": "zero"}}).eval()
    with torch.no_grad():
        alone = model.encode_text(batch(SHORT))[0]
        padded = model.encode_text(batch(SHORT, LONG))[0]
    assert (alone - padded).abs().max().item() > 1e-3


@pytest.mark.parametrize("recipe", DIVE_RECIPES)
def test_dive_recipes_learn_the_pad_row(tmp_path, one_thread, recipe):
    """kdwonn/DivE's word embedding has no padding index: under its attention to padding (pad_mode: code, 1/K of
    every slot) the <pad> row (index 0) gets a gradient; the named option text.pad_row: frozen (padding_idx=0)
    gives it none."""
    code = {"model": {"pad_mode": "code"}}

    def pad_row_grad(**layers: dict) -> float:
        model = dive_recipe_model(tmp_path, recipe, code=code, **layers).train()
        model.encode_text(batch(SHORT, LONG)).sum().backward()
        return model.text.embed.weight.grad[0].abs().max().item()

    assert dive_recipe_model(tmp_path, recipe).text.embed.padding_idx is None
    assert pad_row_grad() > 0
    assert pad_row_grad(frozen={"text": {"pad_row": "frozen"}}) == 0
