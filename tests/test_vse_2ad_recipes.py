"""The paper recipes of VSE+2AD train as the released code (96-Zachary/vse_2ad, docs/methods/vse_2ad.md: the code
is the default): losses.py ``ADCTO`` zeroes the diagonal of the similarity matrix before picking the hardest keys
(``loss.diag_mask: zero``) and masks only the diagonal (``train.mask_same_image: false``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from xmr.run.config import load_run_config

REPO = Path(__file__).resolve().parents[1]
PAPER_RECIPES = [f"{ds}/{name}" for ds in ("coco", "f30k") for name in ("vse_2ad", "vse_2ad_bert")]


@pytest.mark.parametrize("recipe", PAPER_RECIPES)
def test_paper_recipe_has_the_released_codes_diagonal_and_masking(recipe, monkeypatch):
    monkeypatch.chdir(REPO)
    cfg = load_run_config(f"config/recipes/{recipe}.yaml", [])
    assert cfg["method"] == "vse_2ad"
    assert cfg["loss"]["diag_mask"] == "zero"
    assert cfg["train"]["mask_same_image"] is False
    assert cfg["train"]["batch_by"] == "caption"  # the code's loader: random (image, caption) pairs

