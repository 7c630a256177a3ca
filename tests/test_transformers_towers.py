"""transformers vision towers (ViT, CLIP, SigLIP, DINOv2) at local paths: tiny random-initialised models saved with
save_pretrained, loaded by the documented commands. `xmr extract`'s tokens equal the library's own forward on the
library's own preprocessing; the zero-shot run's similarities equal the cosine of get_image_features and
get_text_features; end to end, the tower trains in its own optimizer group at lr x image_backbone_lr_scale."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from conftest import REPO, run_xmr
from xmr.features.store import FeatureFile
from xmr.models.tiny_towers import save_tiny_tower

pytestmark = pytest.mark.usefixtures("one_thread")
FAMILIES = ("vit", "clip_vision", "clip", "siglip", "dinov2")


@pytest.fixture(scope="module")
def towers(tiny_synth, module_tmp):
    """A config dir over tiny_synth's data (64 px images) with one backbone per family, its folder and features."""
    root = module_tmp("towers")
    cfg = tiny_synth.dataset_config_dir(root)
    (cfg / "methods").mkdir()
    (cfg / "methods" / "clip.yaml").write_text((REPO / "config" / "methods" / "clip.yaml").read_text())
    table = {f: {"name": "transformers", "weights": str(save_tiny_tower(f, root / "models" / f)), "batch_size": 8}
             for f in FAMILIES}
    table["vit_patches"] = {**table["vit"], "class_token": False}
    (cfg / "backbones.yaml").write_text(yaml.safe_dump(table))
    return root


def extract(towers: Path, key: str, split: str = "test") -> Path:
    out = towers / "features" / "synth" / key / f"{split}.h5"
    run_xmr("extract", "--dataset", "synth", "--split", split, "--backbone", key, "--config-dir",
            towers / "config", "--out", out, "--workers", "0", "--no-progress", check=True)
    return out


def split_images(towers: Path) -> list[Image.Image]:
    ds = yaml.safe_load((towers / "config" / "datasets" / "synth.yaml").read_text())
    records = [r for r in json.loads(Path(ds["annotations"]).read_text())["images"] if r["split"] == "test"]
    return [Image.open(Path(ds["images"]) / r["filename"]).convert("RGB") for r in records]


def library_pixels(folder: Path, images) -> torch.Tensor:
    """The library's own image processor (PIL, bilinear: the filter xmr resizes with) on the images."""
    from transformers import AutoImageProcessor

    proc = AutoImageProcessor.from_pretrained(folder, use_fast=False)
    return proc(images, resample=Image.BILINEAR, return_tensors="pt")["pixel_values"]


@pytest.mark.parametrize("family", FAMILIES)
def test_extracted_tokens_equal_the_library_forward(towers, family):
    from transformers import AutoModel

    got = FeatureFile(extract(towers, family))
    model = AutoModel.from_pretrained(towers / "models" / family).eval()
    tower = getattr(model, "vision_model", model)
    with torch.no_grad():
        want = tower(pixel_values=library_pixels(towers / "models" / family, split_images(towers))).last_hidden_state
    # 32 px, patch 8: 16 patches, after the class token for all but SigLIP
    assert got.shape == (12, 16 if family == "siglip" else 17, 32)
    np.testing.assert_allclose(np.stack([got[i] for i in range(len(got))]), want.numpy(), atol=2e-5, rtol=1e-4)
    assert got.attrs["resize"] == {"vit": "squash", "siglip": "squash", "dinov2": "center_crop"}.get(
        family, "shorter_side_center_crop")


def test_class_token_dropped_leaves_the_patches(towers):
    full, patches = FeatureFile(extract(towers, "vit")), FeatureFile(extract(towers, "vit_patches"))
    assert patches.shape == (12, 16, 32)
    np.testing.assert_array_equal(patches[3], full[3][1:])


def test_a_missing_model_folder_is_one_line(towers, tmp_path):
    cfg = tmp_path / "config"
    cfg.mkdir()
    (cfg / "datasets").symlink_to(towers / "config" / "datasets")
    (cfg / "backbones.yaml").write_text(yaml.safe_dump({"vit": {"name": "transformers",
                                                                "weights": str(tmp_path / "nowhere")}}))
    r = run_xmr("extract", "--dataset", "synth", "--split", "test", "--backbone", "vit", "--config-dir", cfg,
                "--out", tmp_path / "f.h5", "--workers", "0", "--no-progress")
    assert r.returncode != 0
    assert r.stderr.strip().splitlines() == [
        f"xmr extract: error: backbone vit: {tmp_path / 'nowhere'} is not a transformers model folder (no "
        f"config.json); save the model and its image processor there with save_pretrained, or fix `weights:` in "
        f"backbones.yaml"]


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_zero_shot_similarity_is_the_library_cosine(towers, family):
    """`xmr import-checkpoint --format transformers` then `xmr score`: the cosine of get_image_features and
    get_text_features, captions tokenised as each family's model card says (SigLIP: padded to the full length)."""
    from transformers import AutoModel, AutoTokenizer

    for split in ("train", "val", "test"):
        extract(towers, family, split)
    folder, run = towers / "models" / family, towers / "runs" / f"{family}_zeroshot"
    run_xmr("import-checkpoint", "--format", "transformers", "--src", folder, "--dataset", "synth",
            "--config-dir", towers / "config", "--out", run, "--set", f"features.backbone={family}",
            f"features.dir={towers / 'features'}", check=True)
    run_xmr("score", "--run", run, "--out", towers / f"{family}_sims.npy", "--device", "cpu", "--no-progress",
            check=True)
    sims = np.load(towers / f"{family}_sims.npy")

    ds = yaml.safe_load((towers / "config" / "datasets" / "synth.yaml").read_text())
    records = [r for r in json.loads(Path(ds["annotations"]).read_text())["images"] if r["split"] == "test"]
    captions = [s["raw"] for r in records for s in r["sentences"]]
    model, tok = AutoModel.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    # truncated at the tower's 32 positions (the tiny vocabulary spells words letter by letter)
    padding = {"padding": "max_length" if family == "siglip" else True, "truncation": True, "max_length": 32}
    with torch.no_grad():
        img = model.get_image_features(pixel_values=library_pixels(folder, split_images(towers))).pooler_output
        txt = model.get_text_features(**{k: v for k, v in tok(captions, return_tensors="pt", **padding).items()
                                         if k != "token_type_ids"}).pooler_output
    want = torch.nn.functional.normalize(img, dim=-1) @ torch.nn.functional.normalize(txt, dim=-1).t()
    assert sims.shape == (12, 60)
    np.testing.assert_allclose(sims, want.numpy(), atol=1e-5)


def test_end_to_end_the_tower_trains_at_the_scaled_learning_rate(tiny_synth, towers):
    """`xmr train` of VSE∞ with the tiny ViT inside the model (features.source: images): the tower's parameters form
    the optimizer group `image_backbone` at lr x 0.1 (VSE+2AD's patch setting), its weights moved from the folder's
    (gradients reached it), and an Adam step of a tower weight is at most that group's lr."""
    from transformers import AutoModel

    table = yaml.safe_load((tiny_synth.config_dir / "backbones.yaml").read_text())
    table["tiny_vit"] = {"name": "transformers", "weights": str(towers / "models" / "vit"), "batch_size": 16}
    (tiny_synth.config_dir / "backbones.yaml").write_text(yaml.safe_dump(table))
    recipe = tiny_synth.recipe("vse_inf", name="vse_inf_tiny_vit", text={"encoder": "bigru", "word_vectors": None,
                                                                      "word_dim": 16},
                               features={"source": "images", "backbone": "tiny_vit"},
                               optim={"lr": 0.001, "image_backbone_lr_scale": 0.1}, train={"epochs": 1})
    run = towers / "runs" / "vse_inf_tiny_vit"
    run_xmr("train", "--config", recipe, "--out", run, "--no-progress", check=True)
    last = torch.load(run / "last.pt", map_location="cpu", weights_only=True)
    groups = {g["name"]: g for g in last["optimizer"]["param_groups"]}
    assert groups["image_backbone"]["lr"] == pytest.approx(0.0001) and groups["main"]["lr"] == pytest.approx(0.001)
    start = AutoModel.from_pretrained(towers / "models" / "vit").state_dict()
    trained = {k.removeprefix("image_backbone.net.tower."): v for k, v in last["model"].items()
               if k.startswith("image_backbone.net.tower.")}
    # every encoder weight moved, by at most one lr per Adam step: 15 steps (240 caption pairs in batches of 16)
    # at the group's 1e-4 (at the main lr of 1e-3 they could move 10x as far)
    moved = {k: (trained[k] - v).abs().max().item() for k, v in start.items() if k.startswith("layers.")}
    assert moved and all(0 < d <= 15 * 0.0001 * 1.05 for d in moved.values()), moved


def test_the_bert_text_encoder_reads_a_clip_folders_text_tower(towers):
    """`text.encoder: bert` with `text.bert_path:` a CLIPModel folder (the CLIP-head recipes): the tokens are CLIP's
    text tower's last hidden states, projected; its weights are the pretrained group (text_backbone_lr_scale)."""
    from transformers import AutoModel

    from xmr.models.text import build_text_encoder

    folder = towers / "models" / "clip"
    enc = build_text_encoder({"encoder": "bert", "bert_path": str(folder), "max_len": 32}, 8, None).eval()
    batch = enc.collate(["a red disc", "two blue squares"], [])
    with torch.no_grad():
        h, lengths = enc(batch)
        ref = AutoModel.from_pretrained(folder).text_model(input_ids=batch["input_ids"],
                                                           attention_mask=batch["attention_mask"]).last_hidden_state
    torch.testing.assert_close(h, enc.proj(ref))
    assert lengths.tolist() == batch["attention_mask"].sum(1).tolist()
    assert {n.split(".")[0] for n, _ in enc.named_parameters()} == {"bert", "proj"}
