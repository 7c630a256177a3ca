"""--format pcme: naver-ai/pcme checkpoints give the reference code's μ, log σ and match probabilities.

Fixtures (tests/fixtures/checkpoints/pcme/, recipe in make_fixture.py and tests/fixtures/checkpoints/README.md)
were produced by running the reference's own model and criterion code on CPU."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.fixtures.checkpoints.seeded import WORDS, imported_run_config, seeded_images, seeded_state
from tests.test_checkpoint_pvse import feature_regions
from xmr.checkpoints.pcme import read_pcme
from xmr.inference.model import model_from_config

FIX = Path(__file__).resolve().parent / "fixtures" / "checkpoints" / "pcme"
RECIPE = "recipes/coco/pcme.yaml"


def imported_model(tmp_path: Path, src: Path, options: dict):
    imp = read_pcme(src, None, options)
    cfg = imported_run_config(imp, RECIPE, tmp_path)
    model = model_from_config(cfg, imp.image_dim, imp.vocab_words, pretrained_backbone=False)
    model.load_state_dict(imp.state_dict, strict=True)
    return model.eval(), imp, cfg


def xmr_text_batch(model, ids: torch.Tensor, lengths: torch.Tensor) -> dict:
    index = {w: i for i, w in enumerate(model.text.vocab.words)}
    out = torch.tensor([index[w] for w in WORDS])[ids]
    out[torch.arange(ids.shape[1])[None, :] >= lengths[:, None]] = 0
    return {"ids": out, "lengths": lengths.clone()}


def check_outputs(model, expected: dict, img_dist: tuple, txt_dist: tuple) -> None:
    img_mu, img_ls = img_dist
    txt_mu, txt_ls = txt_dist
    for got, key in ((img_mu, "img_mu"), (img_ls, "img_logsigma"), (txt_mu, "txt_mu"), (txt_ls, "txt_logsigma")):
        torch.testing.assert_close(got, expected[key], rtol=0, atol=1e-5, msg=key)
    # the test score: J = 7 seeded samples per item, xmr's eval noise is the fixture's ε
    torch.testing.assert_close(model.eval_noise(0, img_mu.device), expected["noise"][0], rtol=0, atol=0)
    torch.testing.assert_close(model.eval_noise(1, img_mu.device), expected["noise"][1], rtol=0, atol=0)
    with torch.no_grad():
        img = model._output(img_mu, img_ls, 0)
        txt = model._output(txt_mu, txt_ls, 1)
        prob = model.similarity_matrix(img, txt)
    torch.testing.assert_close(prob, expected["match_prob"], rtol=0, atol=1e-5)


def test_pcme_import_gives_the_reference_mu_logsigma_and_match_probability(tmp_path, one_thread):
    io = torch.load(FIX / "tiny_io.pt", weights_only=True)
    model, imp, cfg = imported_model(tmp_path, FIX / "tiny_coco.pth", {"image_input": "features",
                                                                         "score": "match_prob"})
    assert imp.provenance["negative_scale"] == 0.75 and imp.provenance["shift"] == 6.5
    assert imp.provenance["metadata"] == {"epoch": 29, "rsum": 512.25}  # a numpy float read safely
    assert cfg["model"]["num_samples_eval"] == 7 and cfg["eval"]["similarity"] == "match_prob"
    assert all(v.dtype == torch.float32 for k, v in imp.state_dict.items())  # float16 in the file
    feats = feature_regions(io["feats"])
    with torch.no_grad():
        img_dist = model.image_distribution(feats, torch.full((len(feats),), 49))
        txt_dist = model.text_distribution(xmr_text_batch(model, io["ids"], io["lengths"]))
    check_outputs(model, io, img_dist, txt_dist)


def test_pcme_log_match_prob_default_ranks_by_the_log_of_the_reference_probability(tmp_path, one_thread):
    io = torch.load(FIX / "tiny_io.pt", weights_only=True)
    model, _, cfg = imported_model(tmp_path, FIX / "tiny_coco.pth", {"image_input": "features", "num_samples": "7"})
    assert cfg["model"]["pcme_score"] == "log_match_prob"
    feats = feature_regions(io["feats"])
    with torch.no_grad():
        img = model.encode_image(feats, torch.full((len(feats),), 49))
        txt = model.encode_text(xmr_text_batch(model, io["ids"], io["lengths"]))
        scores = model.similarity_matrix(img, txt)
    torch.testing.assert_close(scores, io["match_prob"].log(), rtol=0, atol=2e-5)


def test_pcme_num_samples_option_sets_j(tmp_path, one_thread):
    io = torch.load(FIX / "tiny_io.pt", weights_only=True)
    model, _, cfg = imported_model(tmp_path, FIX / "tiny_coco.pth", {"image_input": "features", "num_samples": 3})
    feats = feature_regions(io["feats"])
    with torch.no_grad():
        img = model.encode_image(feats, torch.full((len(feats),), 49))
    assert cfg["model"]["num_samples_eval"] == 3 and img.shape == (3, 3, 32)


def test_pcme_full_image_resnet152_gives_the_reference_outputs(tmp_path, one_thread):
    """The released architecture end to end: the checkpoint's ResNet-152 (weights by the seed rule from
    full_layout.json, rounded to float16 as the fixture's reference run) on uint8 images."""
    state = {k: (v.half() if v.is_floating_point() else v) for k, v in seeded_state(FIX / "full_layout.json").items()}
    tiny = torch.load(FIX / "tiny_coco.pth", weights_only=False)
    src = tmp_path / "pcme_coco.pth"
    torch.save({**tiny, "model": state}, src)
    expected = torch.load(FIX / "full_io.pt", weights_only=True)
    io = torch.load(FIX / "tiny_io.pt", weights_only=True)
    model, _, cfg = imported_model(tmp_path, src, {"score": "match_prob"})
    assert cfg["features"]["source"] == "images" and cfg["features"]["backbone"] == "resnet152_224_torchvision"
    with torch.no_grad():
        img_dist = model.image_distribution(*model.image_local_features(seeded_images(), None))
        txt_dist = model.text_distribution(xmr_text_batch(model, io["ids"], io["lengths"]))
    check_outputs(model, expected, img_dist, txt_dist)


# -- bad input: one XmrError line naming the file and what to do ---------------------------------------------
def _error(src: Path, options: dict | None = None, vocab: Path | None = None) -> str:
    import pytest

    from xmr.core.errors import XmrError

    with pytest.raises(XmrError) as e:
        read_pcme(src, vocab, {"image_input": "features", **(options or {})})
    assert "\n" not in str(e.value)
    return str(e.value)


def test_pcme_bad_files(tmp_path):
    tiny = torch.load(FIX / "tiny_coco.pth", weights_only=False)
    src = tmp_path / "pcme_coco.pth"
    src.write_bytes((FIX / "tiny_coco.pth").read_bytes()[:3000])
    assert "not a readable checkpoint" in _error(src)
    torch.save({**tiny, "word2idx": {w: i for i, w in enumerate(WORDS[:-2])}}, src)
    assert "18 words but txt_enc.embed.weight has 20 rows" in _error(src)
    model = dict(tiny["model"])
    del model["img_enc.uncertain_net.fc.bias"]
    model["txt_enc.pie_net.extra"] = torch.zeros(1)
    torch.save({**tiny, "model": model}, src)
    msg = _error(src)
    assert "missing keys image_sigma.fc.bias" in msg and "unexpected keys txt_enc.pie_net.extra" in msg
    torch.save(tiny["model"], src)  # a bare state dict: the words must come from --vocab
    assert "pass --vocab" in _error(src)
    torch.save({**tiny, "criterion": {}}, src)
    assert "lacks shift/negative_scale" in _error(src)
    assert "--option score=best" in _error(FIX / "tiny_coco.pth", {"score": "best"})
