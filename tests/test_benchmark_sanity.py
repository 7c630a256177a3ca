"""The benchmark must tell a broken method from a working one: each deliberate break (captions paired with the wrong
images, a sign flip in the ranking loss, an image feature store of zeros) must drop test RSUM by more than two
standard errors of the difference over 3 seeds (the benchmark's own verdict rule, xmr.studies.benchmark.verdict)."""

import numpy as np
import pytest
import torch
import yaml

from xmr.studies.benchmark import compare, verdict

SEEDS = (0, 1, 2)
REPO_METHODS = __import__("pathlib").Path(__file__).resolve().parents[1] / "config" / "methods"


@pytest.fixture(scope="module")
def small_synth(module_tmp):
    """synth v2 at 64 px: 360 training, 40 validation and 100 test images with EfficientNet-Lite0 features."""
    from xmr.config.loader import load_backbone_config, load_dataset_config
    from xmr.data import load_split
    from xmr.data.synth import generate_synth
    from xmr.features.extract import extract_features

    root = module_tmp("sanity_synth")
    cfg_dir = root / "config"
    (cfg_dir / "datasets").mkdir(parents=True)
    ds = yaml.safe_load((REPO_METHODS.parent / "datasets" / "synth.yaml").read_text())
    ds.update(root=str(root / "data"), annotations=str(root / "data" / "dataset_synth.json"),
              images=str(root / "data" / "images"))
    (cfg_dir / "datasets" / "synth.yaml").write_text(yaml.safe_dump(ds))
    (cfg_dir / "backbones.yaml").write_text(yaml.safe_dump(
        {"efficientnet_lite0": {"name": "efficientnet_lite0", "input_size": 64, "batch_size": 50}}))
    generate_synth(ds["root"], n_train=360, n_val=40, n_test=100, image_size=64, min_objects=3, max_objects=5,
                   progress=False)
    dcfg, bcfg = load_dataset_config("synth", cfg_dir), load_backbone_config("efficientnet_lite0", cfg_dir)
    for split in ("train", "val", "test"):
        extract_features(load_split(dcfg, split), bcfg, root / "features" / "synth" / "efficientnet_lite0" /
                         f"{split}.h5", batch_size=50, workers=0, progress=False)
    return root


def train_and_test(root, seed: int, monkeypatch=None) -> float:
    """VSE++ (its paper's hardest-negative loss) for 6 short epochs; test RSUM."""
    from xmr.run.config import load_run_config
    from xmr.evaluation import evaluate_sims
    from xmr.train.trainer import train
    from xmr.inference.model import score_split

    recipe = root / "config" / "recipes" / "synth" / "vsepp.yaml"
    recipe.parent.mkdir(parents=True, exist_ok=True)
    recipe.write_text(yaml.safe_dump({
        "extends": str(REPO_METHODS / "vsepp.yaml"), "dataset": "synth",
        "features": {"backbone": "efficientnet_lite0", "dir": str(root / "features")},
        "model": {"embed_dim": 64},
        "optim": {"lr": 0.002, "schedule": {"name": "step", "step_epochs": [5]}},
        "train": {"epochs": 6, "batch_size": 40, "seed": seed, "threads": 1, "val_max_images": 40},
        "tracking": {"enabled": False}}))
    cfg = load_run_config(recipe)
    out = root / "runs" / f"s{seed}_{len(list((root).glob('runs/*')))}"
    train(cfg, out, resume=False, progress=False)
    sims, _ = score_split(out, device="cpu", progress=False)
    return evaluate_sims(sims, "plain", captions_per_image=5)["rsum"]


@pytest.fixture(scope="module")
def working(small_synth):
    return {s: train_and_test(small_synth, s) for s in SEEDS}


def assert_detected(working: dict, broken: dict) -> None:
    cmp = compare(working, broken, paired=False)
    assert verdict(cmp["diff"], cmp["p"]) == "holds", (working, broken, cmp)


def test_the_working_method_is_far_above_chance(working):
    # 100 images x 500 captions, ranks at random: t2i R@K = K / 100 and i2t R@K = 1 - C(495, K) / C(500, K)
    # (any of 5 captions): 1 + 5 + 10 + 1.0 + 4.9 + 9.6 = 31.5. Ask for about five times that.
    assert np.mean(list(working.values())) > 150, working


def test_shuffled_pairing_is_detected(small_synth, working, monkeypatch):
    import xmr.train.trainer as trainer

    class Shuffled(trainer.PairDataset):
        """Captions paired with a random other image (a fixed permutation of the training images)."""

        def feature_row(self, i):
            return int(np.random.default_rng(123).permutation(self.data.num_images)[i])

    monkeypatch.setattr(trainer, "PairDataset", Shuffled)
    broken = {s: train_and_test(small_synth, s) for s in SEEDS}
    assert_detected(working, broken)


def test_sign_flip_in_the_ranking_loss_is_detected(small_synth, working, monkeypatch):
    import xmr.methods.vsepp as vsepp

    real = vsepp.triplet_loss
    monkeypatch.setattr(vsepp, "triplet_loss", lambda sims, *a, **k: real(-sims, *a, **k))
    broken = {s: train_and_test(small_synth, s) for s in SEEDS}
    assert_detected(working, broken)


def test_a_feature_store_of_zeros_is_detected(small_synth, working, monkeypatch):
    import xmr.inference.loaders as data

    real = data.read_regions
    monkeypatch.setattr(data, "read_regions", lambda feats, idx, m: (torch.zeros_like(real(feats, idx, m)[0]),
                                                                     real(feats, idx, m)[1]))
    broken = {s: train_and_test(small_synth, s) for s in SEEDS}
    assert_detected(working, broken)
