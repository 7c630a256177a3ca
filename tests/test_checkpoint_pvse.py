"""--format pvse: yalesong/pvse checkpoints give the reference code's embeddings and K x K similarities.

Fixtures (tests/fixtures/checkpoints/pvse/, recipe in make_fixture.py and tests/fixtures/checkpoints/README.md)
were produced by running the reference's own model and loss code on CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.fixtures.checkpoints.seeded import imported_run_config, seeded_images, seeded_state
from xmr.checkpoints.pvse import read_pvse
from xmr.core.errors import XmrError
from xmr.inference.model import model_from_config
from xmr.settings.run_settings import run_settings

FIX = Path(__file__).resolve().parent / "fixtures" / "checkpoints" / "pvse"
VOCAB = FIX / "vocab.pkl"
RECIPE = "recipes/coco/pvse.yaml"


def xmr_batch(model, ids: torch.Tensor, lengths: torch.Tensor, words_ref: list[str]) -> dict:
    """The reference's token ids as a batch of xmr's encoder (ids re-indexed into xmr's vocabulary order)."""
    xmr_index = {w: i for i, w in enumerate(model.text.vocab.words)}
    remap = torch.tensor([xmr_index[w] for w in words_ref])
    out = remap[ids]
    out[torch.arange(ids.shape[1])[None, :] >= lengths[:, None]] = 0
    return {"ids": out, "lengths": lengths.clone()}


def ref_words() -> list[str]:
    from xmr.checkpoints.common import reference_vocab_words

    return reference_vocab_words(VOCAB)


def imported_model(tmp_path: Path, src: Path, options: dict, **sections):
    imp = read_pvse(src, VOCAB, options)
    cfg = imported_run_config(imp, RECIPE, tmp_path, **sections)
    model = model_from_config(cfg, imp.image_dim, imp.vocab_words, pretrained_backbone=False)
    model.load_state_dict(imp.state_dict, strict=True)
    return model.eval(), imp, cfg


def set_sims(img: torch.Tensor, txt: torch.Tensor) -> torch.Tensor:
    return torch.einsum("ikd,jld->ijkl", img, txt)


def feature_regions(maps: torch.Tensor) -> torch.Tensor:
    """(B, F, 7, 7) maps -> (B, 49, F) regions, row-major as the reference's view(-1, F, 49).transpose(1, 2)."""
    return maps.flatten(2).transpose(1, 2)


@pytest.mark.parametrize("name,options,k", [("tiny_k2.pth", {"num_embeds": "2", "legacy": "true"}, 2),
                                            ("tiny_k1.pth", {"legacy": "false"}, 1)])
def test_pvse_import_gives_the_reference_embeddings(tmp_path, one_thread, name, options, k):
    io = torch.load(FIX / "tiny_io.pt", weights_only=True)
    expected = io[f"k{k}"]
    model, imp, cfg = imported_model(tmp_path, FIX / name, {**options, "image_input": "features"})
    assert cfg["model"]["num_embeds"] == k and cfg["text"]["bigru_directions"] == "concat"
    assert cfg["model"]["text_pool"] == ("last" if options["legacy"] == "true" else "final")
    feats = feature_regions(io["feats"])
    with torch.no_grad():
        img = model.encode_image(feats, torch.full((len(feats),), 49))
        txt = model.encode_text(xmr_batch(model, io["ids"], io["lengths"], ref_words()))
    ref_img = expected["img_emb"].reshape(img.shape)  # K = 1: the reference's (B, D) is xmr's (B, 1, D)
    ref_txt = expected["txt_emb"].reshape(txt.shape)
    torch.testing.assert_close(img, ref_img, rtol=0, atol=1e-5)
    torch.testing.assert_close(txt, ref_txt, rtol=0, atol=1e-5)
    torch.testing.assert_close(set_sims(img, txt), expected["sims"].reshape(set_sims(img, txt).shape),
                               rtol=0, atol=1e-5)
    if k == 1:
        assert imp.provenance["epoch"] == 7  # train.py's container


def test_pvse_caption_order_in_the_batch_does_not_matter(tmp_path, one_thread):
    """The reference needs captions sorted by length (pack_padded_sequence); xmr takes any order."""
    io = torch.load(FIX / "tiny_io.pt", weights_only=True)
    model, _, _ = imported_model(tmp_path, FIX / "tiny_k2.pth", {"image_input": "features"})
    perm = torch.tensor([2, 0, 3, 1])
    with torch.no_grad():
        txt = model.encode_text(xmr_batch(model, io["ids"][perm], io["lengths"][perm], ref_words()))
    torch.testing.assert_close(txt, io["k2"]["txt_emb"][perm], rtol=0, atol=1e-5)


def test_pvse_full_image_resnet152_gives_the_reference_embeddings(tmp_path, one_thread):
    """The whole released architecture: the checkpoint's own ResNet-152 (img_enc.cnn.*, weights drawn by the
    fixture's seed rule from full_layout.json) run end to end on uint8 images, as xmr's image backbone."""
    state = seeded_state(FIX / "full_layout.json")
    src = tmp_path / "coco_pvse.pth"
    torch.save({"module." + k: v for k, v in state.items()}, src)
    expected = torch.load(FIX / "full_io.pt", weights_only=True)
    io = torch.load(FIX / "tiny_io.pt", weights_only=True)
    model, imp, cfg = imported_model(tmp_path, src, {"num_embeds": 2})
    assert cfg["features"] == {**cfg["features"], "source": "images", "backbone": "resnet152_224_torchvision"}
    with torch.no_grad():
        img = model.embed_images(seeded_images(), None)
        txt = model.encode_text(xmr_batch(model, io["ids"], io["lengths"], ref_words()))
    torch.testing.assert_close(img, expected["img_emb"], rtol=0, atol=1e-5)
    torch.testing.assert_close(txt, expected["txt_emb"], rtol=0, atol=1e-5)
    torch.testing.assert_close(set_sims(img, txt), expected["sims"], rtol=0, atol=1e-5)


# -- bad input: one XmrError line naming the file / option and what to do -------------------------------------
def _state(name: str = "tiny_k2.pth") -> dict:
    return torch.load(FIX / name, weights_only=True)


def _error(src: Path, options: dict | None = None, vocab: Path = VOCAB) -> str:
    with pytest.raises(XmrError) as e:
        read_pvse(src, vocab, {"image_input": "features", **(options or {})})
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_pvse_truncated_file_is_one_line(tmp_path):
    src = tmp_path / "coco_pvse.pth"
    src.write_bytes((FIX / "tiny_k2.pth").read_bytes()[:5000])
    msg = _error(src)
    assert str(src) in msg and "not a readable checkpoint" in msg


def test_pvse_num_embeds_that_does_not_fit_names_the_flag():
    msg = _error(FIX / "tiny_k2.pth", {"num_embeds": "1"})
    assert "--option num_embeds=1" in msg and "num_embeds=2" in msg


def test_pvse_attention_flags_are_checked():
    assert "--option img_attention=false" in _error(FIX / "tiny_k2.pth", {"img_attention": "false"})
    assert "--option legacy=maybe" in _error(FIX / "tiny_k2.pth", {"legacy": "maybe"})
    assert "--option heads" in _error(FIX / "tiny_k2.pth", {"heads": "2"})


def test_pvse_vocabulary_of_the_wrong_size(tmp_path):
    import pickle

    vocab = tmp_path / "vocab.pkl"
    vocab.write_bytes(pickle.dumps({w: i for i, w in enumerate(ref_words()[:-1])}))
    msg = _error(FIX / "tiny_k2.pth", vocab=vocab)
    assert str(vocab) in msg and "19 words" in msg and "20 rows" in msg


def test_pvse_vocabulary_pickle_runs_no_code(tmp_path):
    vocab = tmp_path / "vocab.pkl"
    vocab.write_bytes(b"cos\nsystem\n(S'true'\ntR.")  # os.system('true') if unpickled naively
    assert "refuses to load os.system" in _error(FIX / "tiny_k2.pth", vocab=vocab)


def test_pvse_missing_and_unexpected_keys(tmp_path):
    state = _state()
    del state["module.txt_enc.rnn.weight_hh_l0"]
    src = tmp_path / "missing.pth"
    torch.save(state, src)
    assert "txt_enc.rnn" in _error(src)
    state = _state()
    state["module.txt_enc.extra.weight"] = torch.zeros(2)
    torch.save(state, src)
    assert "unexpected keys txt_enc.extra.weight" in _error(src)
    torch.save({"img_enc.cnn.conv1.weight": torch.zeros(1)}, src)
    assert "not a PVSE checkpoint" in _error(src)


def test_pvse_full_image_needs_the_cnn():
    msg = _error(FIX / "tiny_k2.pth", {"image_input": "images"})
    assert "no img_enc.cnn.* weights" in msg and "image_input=features" in msg


def test_pvse_training_steps_give_the_reference_loss_and_parameters(tmp_path, one_thread):
    """Two steps of xmr's TrainStep from the imported weights equal two iterations of the reference's train.py
    (model.train(), PVSELoss with margin 0.1, max violation, div 0.1, MMD 0.01; Adam(amsgrad) lr 2e-4; clip 2) on
    the same 4 pairs, under the COCO recipe's settings. Where they could differ, they do not here: dropout is 0
    in both (the README command's default); the word vectors are frozen in both (no --txt_finetune); the 4
    images are distinct, so which same-image captions are masked does not arise. AMSGrad (optim.amsgrad, set by
    the recipe as the code) equals Adam on these two steps: its max only acts once a second moment decreases."""
    from xmr.train.step import TrainForward, TrainStep, build_optimizer

    ref = torch.load(FIX / "tiny_step.pt", weights_only=True)
    model, _, cfg = imported_model(tmp_path, FIX / "tiny_k2.pth", {"image_input": "features"})
    assert (cfg["loss"]["margin"], cfg["loss"]["div_weight"], cfg["loss"]["mmd_weight"]) == (0.1, 0.1, 0.01)
    assert (cfg["optim"]["name"], cfg["optim"]["lr"], cfg["optim"]["grad_clip"]) == ("adam", 2e-4, 2.0)
    assert cfg["optim"]["amsgrad"] and cfg["optim"]["weight_decay"] == 0
    model.train()
    optimizer = build_optimizer(model, cfg["optim"])
    step = TrainStep(model, TrainForward(model), optimizer, torch.amp.GradScaler("cuda", enabled=False),
                     run_settings(cfg), cfg["optim"]["grad_clip"], torch.device("cpu"))
    feats = feature_regions(ref["feats"])
    batch = {"image_index": torch.arange(4), "feats": feats, "num_regions": torch.full((4,), 49),
             "text": xmr_batch(model, ref["ids"], ref["lengths"], ref_words())}
    before = read_pvse(FIX / "tiny_k2.pth", VOCAB, {"image_input": "features"}).state_dict
    for it, expected_step in enumerate(ref["steps"]):
        terms = step(batch, epoch=0, it=it, steps_per_epoch=100)
        for name, ref_name in (("loss", None), ("ranking", "ranking_loss"), ("diversity", "div_loss"),
                               ("mmd", "mmd_loss")):
            want = expected_step["loss"] if ref_name is None else expected_step["terms"][ref_name]
            torch.testing.assert_close(terms[name].detach(), want, rtol=0, atol=1e-5, msg=f"step {it} {name}")
        # the reference's parameters after its step, mapped to xmr's names by the importer itself
        after = tmp_path / f"after{it}.pth"
        torch.save(expected_step["params_after"], after)
        expected = read_pvse(after, VOCAB, {"image_input": "features"}).state_dict
        moved = [k for k in expected if (expected[k] - before[k]).abs().max() > 1e-5]
        assert len(moved) > 10  # every trained tensor moved by more than the tolerance (word vectors are frozen)
        got = model.state_dict()
        for key, value in expected.items():
            torch.testing.assert_close(got[key], value, rtol=0, atol=1e-5, msg=f"step {it} {key}")
        before = expected


def test_optim_amsgrad_option(tmp_path):
    from xmr.train.step import build_optimizer

    model, _, cfg = imported_model(tmp_path, FIX / "tiny_k2.pth", {"image_input": "features"})
    assert all(g["amsgrad"] for g in build_optimizer(model, cfg["optim"]).param_groups)
    assert not any(g["amsgrad"] for g in build_optimizer(model, {**cfg["optim"], "amsgrad": False}).param_groups)
    with pytest.raises(XmrError, match="optim.amsgrad: true needs optim.name adam or adamw"):
        build_optimizer(model, {**cfg["optim"], "name": "sgd"})
