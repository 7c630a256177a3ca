"""Every seed method reduces to the base it extends: with its additions switched off by config options, it is that
base, trained alike on the same seed.

- VSE+2AD -> VSE∞ (GPO on both sides, VSE∞'s hinge with its warm-up);
- CODER -> VSE∞ (no concept branch, no memory bank, VSE∞'s hinge);
- DVSE -> VSE∞ (one embedding, no LayerNorm, no caption residual, no mask, no L_var, no L_ort: its VSE∞ global branch);
- DVSE -> PVSE with K = 1 (its PVSE reading: FC(mean), PVSE's heads);
- DivE -> its global branch, l2norm(LN(global)) on each side, with the triplet on the cosine.

Each pair is trained through the one trainer for two epochs, the first with summed hinges (the warm-up) and the
second with the hardest negative, and must give the same weights, the same loss in each of the two epochs, the same
validation RSUM and the same test embeddings, exactly. The tests marked *sensitive* change one base component on
the method's side and check that the comparison then fails, so that none of them holds by accident."""

from __future__ import annotations

import copy
import csv
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from xmr.inference.model import encode_split_of, load_trained
from xmr.inference.loaders import load_split_images
from xmr.losses.triplet import triplet_loss
from xmr.run.config import load_run_config
from xmr.train.trainer import train
from xmr.settings.run_settings import run_settings

# every pair trains alike: the same optimiser, schedule, batches, text encoder and masking on both sides
COMMON = {
    "optim": {"name": "adamw", "lr": 5e-4, "weight_decay": 1e-4, "grad_clip": 2.0,
              "schedule": {"name": "step", "step_epochs": [15], "gamma": 0.1}},
    "text": {"encoder": "bigru", "word_vectors": None, "word_dim": 16, "finetune_words": True},
    "train": {"epochs": 2, "batch_size": 16, "seed": 3, "mask_same_image": False},
}
AUGMENT = {"size_augment": {"mode": "region", "p": 0.2}, "text_augment": 0.2}  # VSE∞'s recipe
VSE_INF = ("vse_inf", {"model": {"embed_dim": 32, "residual_mlp": True, **AUGMENT},
                       "loss": {"margin": 0.2, "warmup_epochs": 1, "reduction": "sum"}})
# the additions of each method, off
DVSE_AS_VSE_INF = {
    "model": {"embed_dim": 32, "image_projection": "per_region", "residual_mlp": True, "image_pool": "gpo",
              "text_pool": "gpo", "num_embeds": 1, "attention": False, "text_residual": False, "layer_norm": "none",
              "dynamic_mask": {"enabled": False}, **AUGMENT},
    "loss": {"ranking": "triplet_set", "eta": 1.0, "orthogonal": {"enabled": False}, "margin": 0.2,
             "warmup_epochs": 1, "reduction": "sum"}}
VSE_2AD_AS_VSE_INF = {
    "model": {"embed_dim": 32, "residual_mlp": True, "image_pool": "gpo", "text_pool": "gpo", **AUGMENT},
    "loss": {"name": "triplet", "margin": 0.2, "warmup_epochs": 1}}
CODER_AS_VSE_INF = {
    "model": {"embed_dim": 32, "residual_mlp": True, "concept": {"enabled": False}, **AUGMENT},
    "loss": {"ranking": "triplet", "margin": 0.2, "warmup_epochs": 1, "weight_memory": 0.0}}
PVSE = ("pvse", {"model": {"embed_dim": 32, "num_embeds": 1, "image_pool": "mean", "text_pool": "mean",
                           "text_attention_input": "hidden"},
                 "loss": {"margin": 0.2, "warmup_epochs": 1, "reduction": "sum"}})
DVSE_AS_PVSE = {
    "model": {"embed_dim": 32, "image_projection": "pooled_fc", "image_pool": "mean", "text_pool": "mean",
              "num_embeds": 1, "layer_norm": "sum", "dynamic_mask": {"enabled": False},
              "size_augment": {"mode": "none"}, "text_augment": 0.0},
    "loss": {"ranking": "triplet_set", "eta": 1.0, "orthogonal": {"enabled": False}, "margin": 0.2,
             "warmup_epochs": 1, "reduction": "sum"}}
DIVE_GLOBAL = {"model": {"embed_dim": 32, "set_module": False, "size_augment": {"mode": "none"}},
               "loss": {"mmd_weight": 0.0, "warmup_epochs": 1}}


def _vse_inf_names(name: str) -> str:
    """A method's parameter name as VSE∞ calls it (its GPOs sit directly under image_pool/text_pool)."""
    for prefix, base in (("image_pool.gpo.", "image_pool."), ("text_pool.gpo.", "text_pool."),
                         ("image_gpo.", "image_pool."), ("text_gpo.", "text_pool.")):
        if name.startswith(prefix):
            return base + name[len(prefix):]
    return name


PAIRS = {  # reduction: (method, sections), (base method, sections), how the method's names map to the base's
    "dvse_to_vse_inf": (("dvse", DVSE_AS_VSE_INF), VSE_INF, _vse_inf_names),
    "vse_2ad_to_vse_inf": (("vse_2ad", VSE_2AD_AS_VSE_INF), VSE_INF, _vse_inf_names),
    "coder_to_vse_inf": (("coder", CODER_AS_VSE_INF), VSE_INF, _vse_inf_names),
    "dvse_to_pvse_k1": (("dvse", DVSE_AS_PVSE), PVSE, lambda name: name),
}
# DVSE keeps its frozen mask projection and its running mean as buffers (saved, never trained, read only by the mask)
INERT_BUFFERS = {"mask_projection", "mask_feature_mean", "mask_mean_ready"}


def _recipe(tiny_synth, method: str, sections: dict, name: str) -> Path:
    merged = copy.deepcopy(COMMON)
    for key, value in sections.items():
        merged[key] = {**merged.get(key, {}), **value}
    return tiny_synth.recipe(method, name=name, **merged)


def _state(model: torch.nn.Module, rename) -> dict[str, torch.Tensor]:
    return {rename(k): v for k, v in model.state_dict().items() if k not in INERT_BUFFERS and k != "_extra_state"}


def _history(run: Path) -> list[dict]:
    with open(run / "history.csv") as f:
        return [{k: float(row[k]) for k in ("loss", "val_rsum")} for row in csv.DictReader(f)]


def _test_embeddings(run: Path) -> tuple[torch.Tensor, torch.Tensor]:
    model, cfg = load_trained(run, checkpoint=run / "last.pt")
    data, feats = load_split_images(run_settings(cfg).image, cfg["dataset_cfg"], "test")
    img, cap = encode_split_of(model, run_settings(cfg), data, feats, torch.device("cpu"))
    return img.reshape(len(img), -1), cap.reshape(len(cap), -1)  # one embedding: (N, 1, D) -> (N, D)


def differences(method_run: Path, base_run: Path, rename) -> list[str]:
    """What differs between two trained runs: weights (by the base's names), per-epoch loss and validation RSUM,
    test embeddings. Empty when the method reduced to its base."""
    out = []
    a, _ = load_trained(method_run, checkpoint=method_run / "last.pt")
    b, _ = load_trained(base_run, checkpoint=base_run / "last.pt")
    sa, sb = _state(a, rename), _state(b, rename=lambda n: n)
    if set(sa) != set(sb):
        out.append(f"parameters: only the method has {sorted(set(sa) - set(sb))}, only the base "
                   f"{sorted(set(sb) - set(sa))}")
    out += [f"weights differ: {k}" for k in sorted(set(sa) & set(sb)) if not torch.equal(sa[k], sb[k])]
    ha, hb = _history(method_run), _history(base_run)
    out += [f"epoch {i + 1}: {ra} != {rb}" for i, (ra, rb) in enumerate(zip(ha, hb)) if ra != rb]
    for side, x, y in zip(("image", "caption"), _test_embeddings(method_run), _test_embeddings(base_run)):
        if not torch.equal(x, y):
            out.append(f"test {side} embeddings differ (max {float((x - y).abs().max()):.3g})")
    return out


@pytest.fixture(scope="module")
def trained(tiny_synth, module_tmp):
    """Train a (method, sections) once per module: {name: run directory}."""
    runs: dict[str, Path] = {}

    def get(name: str, method: str, sections: dict) -> Path:
        if name not in runs:
            cfg = load_run_config(_recipe(tiny_synth, method, sections, name))
            runs[name] = module_tmp(name)
            train(cfg, runs[name], progress=False)
        return runs[name]

    return get


@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_method_reduces_to_its_base(trained, pair):
    (method, sections), (base, base_sections), rename = PAIRS[pair]
    run = trained(pair, method, sections)
    base_run = trained(f"base_{base}", base, base_sections)
    assert len(_history(run)) == 2
    assert differences(run, base_run, rename) == []


# one base component changed on the method's side: the comparison must see it
SENSITIVE = {
    "dvse_to_vse_inf": {"model": {"gpo": {"temperature": 0.2}}},  # another GPO
    "vse_2ad_to_vse_inf": {"model": {"residual_mlp": False}},      # the projection without its MLP
    "coder_to_vse_inf": {"loss": {"warmup_epochs": 0}},            # the hardest negative from the first step
    "dvse_to_pvse_k1": {"model": {"text_pool": "max"}},            # another h_T
}


@pytest.mark.parametrize("pair", sorted(SENSITIVE))
def test_reduction_test_sees_a_changed_base_component(trained, pair):
    (method, sections), (base, base_sections), rename = PAIRS[pair]
    changed = copy.deepcopy(sections)
    for key, value in SENSITIVE[pair].items():
        changed[key] = {**changed[key], **value}
    run = trained(f"{pair}_changed", method, changed)
    assert differences(run, trained(f"base_{base}", base, base_sections), rename) != []


def test_dive_reduces_to_its_global_branch(tiny_synth, trained):
    """No set prediction module: one embedding per side, l2norm(LN(global)) of DivE's projected regions (pooled)
    and of the BiGRU's last hidden state; no SPM weights; the smooth-Chamfer score of single embeddings is their
    cosine, so the loss is the triplet on the cosine matrix, summed hinges in the warm-up epoch, the hardest
    negative after it (DivE's mean reductions)."""
    from xmr.inference.loaders import image_input, image_loader_parts
    from xmr.models.pooling import POOLS

    run = trained("dive_global", "dive", DIVE_GLOBAL)
    model, cfg = load_trained(run, checkpoint=run / "last.pt")
    assert sorted({n.split(".")[0] for n, _ in model.named_parameters()}) == [
        "image_global_norm", "image_proj", "text", "text_global_norm"]
    data, feats = load_split_images(run_settings(cfg).image, cfg["dataset_cfg"], "test")
    img, cap = encode_split_of(model, run_settings(cfg), data, feats, torch.device("cpu"))
    assert img.shape[1:] == (1, 32) and cap.shape[1:] == (1, 32)
    # by hand, on the first 8 test images and captions, from the model's own modules
    img_set, collate = image_loader_parts(feats, list(range(8)), cfg["features"]["max_regions"])
    x, nr = image_input(collate([img_set[i] for i in range(8)]), torch.device("cpu"))
    batch = model.text.collate(data.captions[:8], data.tokens[:8])
    with torch.no_grad():
        pooled = POOLS[model.model_settings.image_global_pool](model.image_proj(x), nr)
        last_hidden = model.text.encode_with_last_hidden(batch)[2]
        by_hand = (F.normalize(model.image_global_norm(pooled), dim=-1),
                   F.normalize(model.text_global_norm(last_hidden), dim=-1))
    assert torch.allclose(img[:8, 0], by_hand[0], atol=1e-6)
    assert torch.allclose(cap[:8, 0], by_hand[1], atol=1e-6)
    # the loss: the triplet on the cosine matrix, mean over the negatives' hinges in the warm-up, the hardest after
    sims = img[:8, 0] @ cap[:8, 0].t()
    eye = torch.eye(8, dtype=torch.bool)
    out, margin = {"img": img[:8], "txt": cap[:8]}, model.loss_settings.margin
    warm, hard = (model.compute_loss(out, eye, epoch)["loss"].item() for epoch in (0.5, 1.5))
    assert warm == pytest.approx(triplet_loss(sims, eye, margin, False, "mean_negatives").item(), rel=1e-5)
    assert hard == pytest.approx(triplet_loss(sims, eye, margin, True, "mean_negatives").item(), rel=1e-5)
    assert warm != pytest.approx(hard, rel=1e-3)
