"""End-to-end training from images (features.source: images; xmr/models/image_backbone.py) at toy size: 64 px synth images
through EfficientNet-Lite0 (2 x 2 grid) inside the model."""

import json
import signal

import numpy as np
import pytest
import torch
from conftest import REPO, history_rows, train_cli
from PIL import Image

from xmr.run.config import load_run_config
from xmr.core.errors import XmrError
from xmr.features.backbones import build_backbone
from xmr.core.io import load_checkpoint
from xmr.inference.loaders import TrainAugment
from xmr.models.image_backbone import FinetunedBackbone
from xmr.train.step import build_optimizer
from xmr.train.trainer import train
from xmr.inference.model import model_from_config, score_split

E2E = {"source": "images"}


def _recipe(tiny_synth, name, image_backbone=None, **sections):
    return tiny_synth.recipe("vse_inf", name=name, features=E2E, image_backbone=image_backbone or {}, **sections)


def _pretrained_state() -> dict[str, torch.Tensor]:
    return build_backbone({"name": "efficientnet_lite0", "input_size": 64}).state_dict()


def _backbone_state(ck: dict) -> dict[str, torch.Tensor]:
    prefix = "image_backbone.net."
    return {k[len(prefix):]: v for k, v in ck["model"].items() if k.startswith(prefix)}


def _is_bn_stat(name: str) -> bool:
    return name.endswith(("running_mean", "running_var", "num_batches_tracked"))


@pytest.fixture(scope="module")
def frozen_then_trained(tiny_synth, module_tmp):
    """Two epochs: backbone frozen in the first, trained (lr x 0.1, BN frozen) in the second; crops and flips on."""
    out = module_tmp("e2e") / "run"
    cfg = load_run_config(_recipe(tiny_synth, "e2e_two_epochs", {
        "frozen_epochs": 1, "unfreeze_loss_ramp": True, "crop_scale": [0.6, 1.0], "hflip": 0.5},
        train={"epochs": 2}, optim={"image_backbone_lr_scale": 0.1}))
    summary = train(cfg, out, progress=False)
    return out, summary


def test_trains_scores_and_checkpoints_the_backbone(frozen_then_trained):
    out, summary = frozen_then_trained
    assert [r["epoch"] for r in summary["history"]] == [1, 2]
    assert all(np.isfinite(r["loss"]) for r in summary["history"])
    for name in ("best.pt", "last.pt"):
        ck = load_checkpoint(out / name)  # weights_only=True inside
        assert set(_backbone_state(ck)) == set(_pretrained_state())  # every backbone tensor is saved
        assert ck["image_dim"] == 1280
    sims, info = score_split(out, progress=False)  # images of the test split encoded from their files
    assert sims.shape == (12, 60) and info["split"] == "test"
    assert np.isfinite(sims).all() and np.abs(sims).max() <= 1.0 + 1e-5


def test_backbone_changes_after_unfreezing_but_bn_statistics_do_not(frozen_then_trained):
    out, _ = frozen_then_trained
    trained, pre = _backbone_state(load_checkpoint(out / "last.pt")), _pretrained_state()
    unchanged = {k for k in pre if not _is_bn_stat(k) and torch.equal(trained[k], pre[k])}
    # every weight of the CNN (incl. BN affine) was updated in epoch 2, except the ImageNet classifier, which
    # grid features do not use (no gradient, so AdamW leaves it alone)
    assert unchanged == {"net._fc.weight", "net._fc.bias"}
    for k in pre:
        if _is_bn_stat(k):
            assert torch.equal(trained[k], pre[k]), k  # freeze_bn: running statistics are ImageNet's


def test_backbone_is_bit_identical_while_frozen(tiny_synth, tmp_path):
    cfg = load_run_config(_recipe(tiny_synth, "e2e_frozen", {"frozen_epochs": 1, "freeze_bn": False},
                                  train={"epochs": 1}))
    train(cfg, tmp_path / "run", progress=False)
    ck = load_checkpoint(tmp_path / "run" / "last.pt")
    trained, pre = _backbone_state(ck), _pretrained_state()
    for k in pre:  # weights and (although freeze_bn is off) BN statistics: a frozen backbone runs in eval mode
        assert torch.equal(trained[k], pre[k]), k
    # ...while the rest of the model trained: Adam state exists only for parameters that got gradients
    groups = {g["name"]: g for g in ck["optimizer"]["param_groups"]}
    state = ck["optimizer"]["state"]
    assert all(i not in state for i in groups["image_backbone"]["params"])
    assert all(i in state for i in groups["main"]["params"])


def test_backbone_group_lr_is_lr_times_factor(tiny_synth):
    cfg = load_run_config(_recipe(tiny_synth, "e2e_groups", optim={"lr": 0.0004, "image_backbone_lr_scale": 0.05,
                                                                    "text_backbone_lr_scale": 0.1}))
    model = model_from_config(cfg, None, ["<pad>", "<unk>", "<start>", "<end>", "a", "cat"])
    opt = build_optimizer(model, cfg["optim"])
    groups = {g["name"]: g for g in opt.param_groups}
    assert set(groups) == {"main", "image_backbone"}
    assert groups["image_backbone"]["lr"] == pytest.approx(2e-5, rel=1e-12)  # 0.0004 x 0.05
    assert groups["main"]["lr"] == pytest.approx(4e-4, rel=1e-12)
    backbone = {id(p) for p in model.image_backbone.parameters()}
    assert {id(p) for p in groups["image_backbone"]["params"]} == backbone
    assert not backbone & {id(p) for p in groups["main"]["params"]}
    n_all = sum(1 for p in model.parameters() if p.requires_grad)
    assert sum(len(g["params"]) for g in opt.param_groups) == n_all  # every parameter in exactly one group


def test_text_backbone_group_is_kept_next_to_the_image_backbone(tiny_synth):
    cfg = load_run_config(_recipe(tiny_synth, "e2e_bert", text={"encoder": "bert", "bert_path": "minilm"},
                                  optim={"lr": 0.001, "image_backbone_lr_scale": 0.01,
                                         "text_backbone_lr_scale": 0.1}))
    groups = {g["name"]: g for g in build_optimizer(model_from_config(cfg, None, None), cfg["optim"]).param_groups}
    assert set(groups) == {"main", "text_backbone", "image_backbone"}
    assert groups["text_backbone"]["lr"] == pytest.approx(1e-4, rel=1e-12)
    assert groups["image_backbone"]["lr"] == pytest.approx(1e-5, rel=1e-12)


def _bn_stats(m: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in m.state_dict().items() if _is_bn_stat(k)}


@pytest.mark.parametrize("freeze_bn,frozen,stats_move", [(True, False, False), (False, False, True),
                                                         (False, True, False)])
def test_batchnorm_statistics(freeze_bn, frozen, stats_move):
    net = FinetunedBackbone(build_backbone({"name": "efficientnet_lite0"}), freeze_bn=freeze_bn)
    net.set_frozen(frozen)
    net.train()
    before = _bn_stats(net)
    images = torch.randint(0, 256, (4, 3, 64, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    feats, n = net(images)
    assert feats.shape == (4, 4, 1280) and n.tolist() == [4, 4, 4, 4]
    assert feats.requires_grad is not frozen  # a frozen backbone builds no graph
    after = _bn_stats(net)
    moved = [k for k in before if not torch.equal(before[k], after[k])]
    assert bool(moved) is stats_move


def test_train_augment_crops_and_flips():
    arr = np.arange(48 * 64 * 3, dtype=np.uint8).reshape(48, 64, 3)
    im = Image.fromarray(arr)
    torch.manual_seed(0)
    crop = TrainAugment(crop_scale=[0.5, 0.5])(im)
    assert crop.size == (32, 24)  # int(64 x 0.5), int(48 x 0.5)
    c = np.asarray(crop)
    top, left = np.argwhere((arr == c[0, 0]).all(-1))[0]  # where the crop came from
    assert np.array_equal(arr[top:top + 24, left:left + 32], c)
    flipped = np.asarray(TrainAugment(hflip=1.0)(im))
    assert np.array_equal(flipped, arr[:, ::-1])
    assert np.array_equal(np.asarray(TrainAugment(hflip=0.0)(im)), arr)


def test_threads_option_sets_torch_threads(tiny_synth, tmp_path):
    before = torch.get_num_threads()
    cfg = load_run_config(tiny_synth.recipe("vsepp", name="threads_one", train={"threads": 1}))
    try:
        train(cfg, tmp_path / "run", progress=False)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("key,value,message", [
    ("features.source", "pixels", "features.source"),
    ("image_backbone.hflip", 1.5, "image_backbone.hflip"),
    ("image_backbone.crop_scale", [0.6], "image_backbone.crop_scale"),
    ("image_backbone.frozen_epochs", -1, "image_backbone.frozen_epochs"),
    ("image_backbone.input_size", 8, "image_backbone.input_size"),
    ("image_backbone.freez_bn", True, "freez_bn"),
    ("optim.image_backbone_lr_scale", -0.1, "optim.image_backbone_lr_scale"),
    ("train.threads", 0, "train.threads"),
])
def test_bad_values_fail_at_load_naming_the_key(tiny_synth, key, value, message):
    path = _recipe(tiny_synth, "e2e_bad")
    with pytest.raises(XmrError) as e:
        load_run_config(path, [f"{key}={json.dumps(value)}"])
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("overrides,message", [
    (["image_backbone.crop_scale=[0.9, 0.6]"], "image_backbone.crop_scale"),
    (["features.backbone=butd_roi_synth"], "features.backbone"),
])
def test_bad_combinations_fail_before_training(tiny_synth, tmp_path, overrides, message):
    import yaml

    bb = tiny_synth.config_dir / "backbones.yaml"
    table = yaml.safe_load(bb.read_text())
    if "butd_roi_synth" not in table:  # a region backbone: end to end needs a grid
        table["butd_roi_synth"] = {"name": "roi_align", "trunk": "efficientnet_lite0", "boxes": "annotations"}
        bb.write_text(yaml.safe_dump(table))
    cfg = load_run_config(_recipe(tiny_synth, "e2e_bad_combo"), overrides)
    with pytest.raises(XmrError) as e:
        train(cfg, tmp_path / "run", progress=False)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "run").exists()  # failed before any work


def test_killed_e2e_run_resumes_to_the_same_result(tiny_synth, tmp_path):
    recipe = _recipe(tiny_synth, "e2e_resume", {"frozen_epochs": 1, "unfreeze_loss_ramp": True,
                                                "crop_scale": [0.6, 1.0], "hflip": 0.5}, train={"epochs": 2})
    ref, killed = tmp_path / "uninterrupted", tmp_path / "killed"
    train_cli(recipe, ref)
    assert train_cli(recipe, killed, kill_after_first_epoch=True) == -signal.SIGKILL
    assert not (killed / "train.json").exists()  # it really died before finishing
    output = train_cli(recipe, killed)
    assert f"resuming {killed} after epoch 1" in output
    # the unfrozen epoch 2 (random crops and flips, loss ramp, backbone updates) repeats exactly
    assert history_rows(killed) == history_rows(ref)


def test_workflow_inputs_of_e2e_recipes_are_the_annotations():
    from xmr.planning.workflow_inputs import recipe_image_inputs

    cfg_dir = REPO / "config"
    assert recipe_image_inputs("synth", "vse_inf_e2e", "train", cfg_dir) == ["data/synth/dataset_synth.json"]
    assert recipe_image_inputs("synth", "vse_inf_e2e", "score", cfg_dir) == ["data/synth/dataset_synth.json"]
    assert recipe_image_inputs("coco", "vse_inf_resnext_bert_e2e", "train", cfg_dir) == ["data/coco/dataset_coco.json"]
    # precomputed recipes keep depending on their feature files
    assert recipe_image_inputs("synth", "vse_inf", "train", cfg_dir) == [
        "features/synth/efficientnet_lite0_128/train.h5", "features/synth/efficientnet_lite0_128/val.h5"]
    assert recipe_image_inputs("synth", "vse_inf", "score", cfg_dir) == ["features/synth/efficientnet_lite0_128/test.h5"]
