"""Every registered method (the built-in ones and any named in $XMR_PLUGINS) honours the RetrievalModel contract at
toy size, read from the registry so that a new method is covered with no edit here: it builds from its method file,
trains one epoch (finite loss, checkpoints), scores the test split, reloads from its checkpoint to the same scores,
and answers through the inference API (xmr.load: encode, similarity, search) with the matrix `xmr score` wrote.
Method-specific behaviour is tested in each method's own file."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from xmr.config.loader import deep_merge
from xmr.core.errors import XmrError
from xmr.inference.model import load, load_trained, score_split
from xmr.methods import METHODS
from xmr.methods.base import settings_from
from xmr.run.config import load_run_config
from xmr.train.trainer import train

# the toy size every method is built at: random word vectors (GloVe would dominate the run time) and a BiGRU, so
# that no method needs precomputed text features here (RRF's HGLMM path is tested in test_rrf.py)
TOY_TEXT = {"encoder": "bigru", "word_vectors": None, "word_dim": 16}


@pytest.fixture(scope="module")
def trained(tiny_synth, module_tmp):
    """Each method trained once, lazily: {method: run directory}."""
    runs: dict[str, object] = {}

    def get(method: str):
        if method not in runs:
            cls = METHODS.get(method)
            sections = deep_merge({"text": TOY_TEXT}, cls.conformance_overrides)
            if hasattr(cls, "conformance_setup"):  # a method that needs files of its own (a checkpoint folder)
                sections = deep_merge(sections, cls.conformance_setup(tiny_synth.config_dir,
                                                                      module_tmp(f"conformance_{method}_files")))
            recipe = tiny_synth.recipe(method, name=f"conformance_{method}", **sections)
            cfg = load_run_config(recipe)
            run = module_tmp(f"conformance_{method}")
            summary = train(cfg, run, progress=False)
            runs[method] = (run, summary)
        return runs[method]

    return get


@pytest.mark.parametrize("method", METHODS.names())
def test_method_settings_classes_are_its_schema_sections(method):
    """A method's settings dataclasses name exactly the properties of its schema's ``model``/``loss`` sections
    (a drifted name fails here, not partway through an epoch), are frozen, and restate no default (the schema
    holds them)."""
    cls = METHODS.get(method)
    for section, settings in (("model", cls.model_settings_class), ("loss", cls.loss_settings_class)):
        assert dataclasses.is_dataclass(settings) and settings.__dataclass_params__.frozen, settings
        fields = dataclasses.fields(settings)
        props = cls.schema["properties"][section]["properties"]
        assert {f.name for f in fields} == set(props), (method, section)
        # no default restated; None only stands for a property the schema leaves optional with no default
        for f in fields:
            assert f.default_factory is dataclasses.MISSING, (method, f.name)
            if f.default is not dataclasses.MISSING:
                assert f.default is None and "default" not in props[f.name], (method, f.name)
                assert f.name not in cls.schema["properties"][section].get("required", []), (method, f.name)


def test_a_settings_class_that_drifted_from_its_section_fails_when_the_model_is_built():
    @dataclasses.dataclass(frozen=True)
    class Loss:
        margin: float
        max_violaton: bool  # misspelt

    with pytest.raises(XmrError, match=r"vsepp: loss: Loss and the method's schema disagree \(no value for "
                                       r"\['max_violaton'\], no field for \['max_violation'\]\)"):
        settings_from(Loss, {"margin": 0.2, "max_violation": True}, "vsepp: loss")
    assert settings_from(Loss, {"margin": 0.2, "max_violaton": True}, "x") == Loss(0.2, True)

    @dataclasses.dataclass(frozen=True)
    class Model:
        embed_dim: int
        image_encoder: str | None = None  # a property without a schema default: may be absent

    assert settings_from(Model, {"embed_dim": 8}, "x") == Model(8, None)
    assert settings_from(Model, {"embed_dim": 8, "image_encoder": "full_image"}, "x").image_encoder == "full_image"
    with pytest.raises(XmrError, match=r"no value for \['embed_dim'\]"):
        settings_from(Model, {"image_encoder": "regions"}, "x")


def test_a_method_builds_from_its_settings_without_a_run_config():
    """VSE++ from hand-made settings (no run config anywhere): embeddings of the configured width, and the
    hardest-negative triplet loss of a forward output worked out by hand (margin 0.2)."""
    import torch.nn.functional as F

    from xmr.methods.base import MethodSettings, Scoring
    from xmr.methods.vsepp import VSEPP, VSEPPLoss, VSEPPModel

    settings = MethodSettings(
        method="vsepp", model=VSEPPModel(embed_dim=8, residual_mlp=False, image_pool="mean", text_pool="mean"),
        loss=VSEPPLoss(margin=0.2, max_violation=True, reduction="sum", warmup_epochs=0),
        scoring=Scoring(similarity="cosine", alpha=16.0, rerank={}),
        text={"encoder": "bigru", "word_vectors": None, "word_dim": 4}, seed=0)
    model = VSEPP(settings, image_dim=6, vocab_words=["<pad>", "<unk>", "<start>", "<end>", "dog"])
    out = model(torch.randn(2, 3, 6), torch.tensor([3, 1]), model.text.collate(["dog", "dog dog"],
                                                                                  [["dog"], ["dog", "dog"]]))
    assert out["img"].shape == (2, 8) and out["txt"].shape == (2, 8)
    # img @ txt.T = [[.5, .6, .1], [.2, .4, .3], [0, .5, .7]]: image rows' hardest hinges .3 + .1 + 0, caption
    # columns' 0 + .4 + 0
    sims = torch.tensor([[0.5, 0.6, 0.1], [0.2, 0.4, 0.3], [0.0, 0.5, 0.7]])
    terms = model.compute_loss({"img": torch.eye(3), "txt": sims.t()}, torch.eye(3, dtype=torch.bool), 0.0)
    assert terms["loss"].item() == pytest.approx(0.8)
    assert torch.allclose(F.normalize(out["img"], dim=-1), out["img"])


def test_no_method_reads_the_run_config_or_keeps_state_between_forward_and_loss():
    src = Path(__file__).resolve().parents[1] / "xmr" / "methods"
    found = [f"{f.name}: {m.group(0)}" for f in sorted(src.glob("*.py"))
             for m in re.finditer(r"self\.cfg\b|\b_aux\b|batch_image_index|gather_aux", f.read_text())]
    assert found == []


@pytest.mark.parametrize("method", METHODS.names())
def test_method_trains_one_epoch_and_checkpoints(trained, method):
    run, summary = trained(method)
    assert summary["best_epoch"] == 1 and len(summary["history"]) == 1
    assert np.isfinite(summary["history"][0]["loss"])
    for name in ("best.pt", "last.pt", "config.yaml", "history.csv", "train.json"):
        assert (run / name).exists(), name
    ck = torch.load(run / "best.pt", map_location="cpu", weights_only=True)  # tensors and plain data only
    assert set(ck) >= {"model", "vocab_words", "image_dim"}


@pytest.mark.parametrize("method", METHODS.names())
def test_method_scores_and_reloads_to_the_same_scores(trained, method):
    run, _ = trained(method)
    sims, info = score_split(run, progress=False)
    assert sims.shape == (12, 60) and info["split"] == "test" and np.isfinite(sims).all()
    assert float(sims.std()) > 0.0  # a constant matrix ranks nothing
    again, _ = score_split(run, progress=False)  # a fresh load of best.pt in eval mode: deterministic
    np.testing.assert_array_equal(sims, again)
    model, cfg = load_trained(run)
    assert not model.training and cfg["method"] == method


@pytest.mark.parametrize("method", METHODS.names())
def test_method_answers_through_the_inference_api(trained, method):
    run, _ = trained(method)
    sims, _ = score_split(run, progress=False)
    m = load(run, device="cpu")
    g = m.encode_split("test")
    assert len(g["image_ids"]) == 12 and len(g["captions"]) == 60
    np.testing.assert_allclose(m.similarity(g["image_emb"], g["text_emb"]), sims, atol=1e-5)
    # a caption's embedding as the query: the three best images of its column of the scored matrix, best first
    idx, scores = m.search(g["text_emb"][7:8], g["image_emb"], k=3, queries_are="text")
    want = np.argsort(-sims[:, 7], kind="stable")[:3]
    np.testing.assert_allclose(scores[0], sims[want, 7], atol=1e-5)
    assert set(idx[0]) == set(want) and scores[0][0] >= scores[0][1] >= scores[0][2]
    # free text goes through the method's own text encoder
    idx, scores = m.search([g["captions"][7], "a red circle"], g["image_emb"], k=3)
    assert idx.shape == (2, 3) and np.isfinite(scores).all()
