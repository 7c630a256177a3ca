"""RRF-Net: bi-rank loss against hand-worked values and a brute-force loop, the recurrent residual fusion
block, parameter counts from the method card, the precomputed text encoder, and training on tiny synth
with HGLMM features computed by `xmr text-features`."""

import math
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import yaml

from xmr.cli import main as xmr_main
from xmr.run.config import load_run_config
from xmr.core.errors import XmrError
from xmr.losses.bi_rank import bi_rank_loss
from xmr.losses.triplet import triplet_loss
from xmr.methods.rrf import RecurrentResidualFusion, RRFBranch, RRFNet, RRFNetModel
from xmr.planning.workflow_inputs import recipe_text_feature_files
from xmr.models.text_precomputed import PrecomputedTextEncoder
from xmr.text.hglmm import HGLMMModel
from xmr.train.trainer import train
from xmr.inference.model import score_split

REPO = Path(__file__).resolve().parents[1]

# -- bi-rank loss ----------------------------------------------------------------------------------------

C30, S30 = math.cos(math.pi / 6), 0.5


def two_pairs():
    img = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    txt = torch.tensor([[C30, S30], [0.6, 0.8]])
    return img, txt


def test_bi_rank_loss_hand_computed():
    img, txt = two_pairs()
    # d = -cos. d(x0,y0) = -cos30, d(x1,y1) = -0.8, d(x0,y1) = -0.6, d(x1,y0) = -0.5,
    # d(y0,y1) = -(0.6 cos30 + 0.4), d(x0,x1) = 0; margin 0.5, every negative violates the cross-modal hinge
    m = 0.5
    d_yy = -(0.6 * C30 + 0.4)
    i2t_cross = (-C30 + 0.6 + m) + (-0.8 + 0.5 + m)
    i2t_intra = (-C30 - d_yy + m) + (-0.8 - d_yy + m)
    t2i_cross = (-C30 + 0.5 + m) + (-0.8 + 0.6 + m)
    t2i_intra = max(0.0, -C30 - 0 + m) + max(0.0, -0.8 - 0 + m)  # both hinges inactive
    assert t2i_intra == 0.0
    total = 1 * i2t_cross + 0.5 * i2t_intra + 2 * t2i_cross + 1 * t2i_intra
    out = bi_rank_loss(img, txt, margin=m, n_neg=1, weights=(1, 0.5, 2, 1))
    assert out["loss"].item() == pytest.approx(total / 2, rel=1e-6)  # / (N * B) = 1 * 2
    assert out["i2t_intra"].item() == pytest.approx(i2t_intra / 2, rel=1e-6)
    # N = 50 > B - 1: still divided by N * B = 100 (released code)
    assert bi_rank_loss(img, txt, margin=m, n_neg=50)["loss"].item() == pytest.approx(total / 100, rel=1e-6)
    # margin 0.1: nothing violates -> 0
    assert bi_rank_loss(img, txt, margin=0.1, n_neg=1)["loss"].item() == 0.0


def brute_force_bi_rank(img, txt, ids, margin, n_neg, w):
    img, txt = img.double().tolist(), txt.double().tolist()
    b = len(img)

    def d(u, v):
        return -sum(a * c for a, c in zip(u, v))

    total = 0.0
    for i in range(b):
        pos = d(img[i], txt[i])
        # image anchor: captions of other images, margin-violating, closest first
        cand = sorted((d(img[i], txt[j]), j) for j in range(b) if ids[j] != ids[i]
                      and pos - d(img[i], txt[j]) + margin > 0)[:n_neg]
        for _, j in cand:
            total += w[0] * max(0, pos - d(img[i], txt[j]) + margin) + w[1] * max(0, pos - d(txt[i], txt[j]) + margin)
        cand = sorted((d(img[j], txt[i]), j) for j in range(b) if ids[j] != ids[i]
                      and pos - d(img[j], txt[i]) + margin > 0)[:n_neg]
        for _, j in cand:
            total += w[2] * max(0, pos - d(img[j], txt[i]) + margin) + w[3] * max(0, pos - d(img[i], img[j]) + margin)
    return total / (n_neg * b)


def test_bi_rank_loss_equals_brute_force_with_repeated_images():
    g = torch.Generator().manual_seed(0)
    ids = torch.tensor([0, 1, 0, 2, 3, 1, 4, 5])  # images 0 and 1 appear twice: never negatives of each other
    img_table = torch.nn.functional.normalize(torch.randn(6, 5, generator=g), dim=1)
    img = img_table[ids]
    txt = torch.nn.functional.normalize(torch.randn(8, 5, generator=g), dim=1)
    pos_mask = ids[:, None] == ids[None, :]
    w = (1.0, 0.5, 2.0, 1.0)
    for n_neg in (1, 2, 50):
        got = bi_rank_loss(img, txt, pos_mask, margin=0.4, n_neg=n_neg, weights=w)["loss"].item()
        assert got == pytest.approx(brute_force_bi_rank(img, txt, ids.tolist(), 0.4, n_neg, w), rel=1e-6)
    # sign flip of every embedding leaves d = -cos unchanged
    a = bi_rank_loss(img, txt, pos_mask, 0.4, 2, w)["loss"]
    assert bi_rank_loss(-img, -txt, pos_mask, 0.4, 2, w)["loss"].item() == pytest.approx(a.item(), rel=1e-6)
    # the thesis' literal "most dissimilar" negatives give a smaller loss here
    easy = bi_rank_loss(img, txt, pos_mask, 0.4, 2, w, negatives="most_dissimilar")["loss"]
    assert easy.item() < a.item()


def test_bi_rank_with_one_negative_and_no_intra_terms_is_vsepp_mean():
    g = torch.Generator().manual_seed(1)
    img = torch.nn.functional.normalize(torch.randn(6, 4, generator=g), dim=1)
    txt = torch.nn.functional.normalize(torch.randn(6, 4, generator=g), dim=1)
    ours = bi_rank_loss(img, txt, margin=0.2, n_neg=1, weights=(1, 0, 1, 0))["loss"]
    vsepp = triplet_loss(img @ txt.t(), margin=0.2, max_violation=True, reduction="mean")
    assert ours.item() == pytest.approx(vsepp.item(), rel=1e-6)


# -- the recurrent residual fusion block --------------------------------------------------------------------

def test_rrf_block_hand_computed_and_per_step_batchnorm():
    block = RecurrentResidualFusion(dim=2, steps=1, fusion="conv", fusion_bn=False)
    with torch.no_grad():
        block.fc.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, -1.0]]))
        block.fc.bias.zero_()
        block.fusion_weight.copy_(torch.tensor([0.5, 2.0]))
        block.fusion_bias.fill_(0.1)
    block.eval()  # BN with running mean 0, var 1, gamma 1, beta 0: identity up to eps
    x = torch.tensor([[1.0, 2.0]])
    # x1 = x + relu(Wx) = [1, 2] + relu([1, -2]) = [2, 2]; x2 = x1 + relu(W x1) = [2, 2] + [2, 0] = [4, 2]
    s = 1 / math.sqrt(1 + 1e-5)
    x1 = torch.tensor([[1 + s, 2.0]])
    x2 = x1 + torch.relu(torch.tensor([[x1[0, 0], -x1[0, 1]]]) * s)
    steps = block.step_outputs(x)
    assert len(steps) == 2
    torch.testing.assert_close(steps[0], x1)
    torch.testing.assert_close(steps[1], x2)
    torch.testing.assert_close(block(x), 0.5 * x1 + 2.0 * x2 + 0.1)

    # shared FC, one BN per step with its own running statistics; a scalar BN after the fusion
    block = RecurrentResidualFusion(dim=8, steps=3, fusion="conv", fusion_bn=True)
    assert len(block.norms) == 4 and sum(isinstance(m, torch.nn.Linear) for m in block.modules()) == 1
    block.train()
    out = block(torch.randn(16, 8))
    assert out.shape == (16, 8) and (out >= 0).all()  # ReLU after the fusion BN
    means = torch.stack([n.running_mean for n in block.norms])
    assert all(not torch.allclose(means[0], means[t]) for t in range(1, 4))
    assert block.fusion_norm.running_mean.shape == (1,)
    # fusion "none" returns the last step; "sum" sums them
    none = RecurrentResidualFusion(dim=8, steps=2, fusion="none").eval()
    v = torch.randn(3, 8)
    torch.testing.assert_close(none(v), none.step_outputs(v)[-1])
    summ = RecurrentResidualFusion(dim=8, steps=2, fusion="sum", fusion_bn=False).eval()
    torch.testing.assert_close(summ(v), sum(summ.step_outputs(v)))


def model_cfg(**kw):
    m = {k: v["default"] for k, v in RRFNet.schema["properties"]["model"]["properties"].items() if "default" in v}
    return RRFNetModel(**(m | {"embed_dim": 512} | kw))


def count(module):
    return sum(p.numel() for p in module.parameters())


def test_parameter_counts_match_the_method_card():
    # card §3.1: T=3, conv fusion, input BN, image 2048-d + text 6000-d inputs: 19,663,598; baseline 19,657,440
    assert count(RRFBranch(2048, model_cfg())) + count(RRFBranch(6000, model_cfg())) == 19_663_598
    base = model_cfg(rrf=False)
    assert count(RRFBranch(2048, base)) + count(RRFBranch(6000, base)) == 19_657_440
    # each extra step adds one BN (2 x 512) and one fusion weight per branch
    assert count(RRFBranch(64, model_cfg(steps=4))) - count(RRFBranch(64, model_cfg(steps=3))) == 2 * 512 + 1


def test_branch_output_is_unit_length():
    branch = RRFBranch(20, model_cfg(embed_dim=16, hidden_dim=32)).train()  # batch statistics: |z| ~ 4
    out = branch(torch.randn(5, 20))
    torch.testing.assert_close(out.norm(dim=1), torch.ones(5), atol=1e-5, rtol=0)


# -- HGLMM features for tiny synth, the precomputed encoder, training ---------------------------------------

@pytest.fixture(scope="module")
def tiny_hglmm(tiny_synth, module_tmp):
    """`xmr text-features` on the tiny synth set with small settings; returns the output folder."""
    root = module_tmp("hglmm")
    cfg_dir = tiny_synth.dataset_config_dir(root)
    (cfg_dir / "text_features.yaml").write_text(yaml.safe_dump({"hglmm": {
        "word_vectors": "glove6b50d", "vocab_limit": 5000, "fit_samples": 1500, "ica_max_iter": 100,
        "components": 4, "em_iterations": 5, "pca_dim": 64}}))
    out = root / "features" / "synth" / "hglmm"
    rc = xmr_main(["text-features", "--dataset", "synth", "--kind", "hglmm", "--fit-split", "train", "--splits",
                   "train", "val", "test", "--out-dir", str(out), "--config-dir", str(cfg_dir), "--set",
                   "pca_dim=32", "--device", "cpu", "--no-progress"])
    assert rc == 0
    return {"dir": out, "config_dir": cfg_dir}


def test_text_features_files(tiny_hglmm, tiny_synth):
    from xmr.config.loader import load_dataset_config
    from xmr.data import load_split

    model = HGLMMModel.load(tiny_hglmm["dir"] / "model.npz")
    assert model.settings["pca_dim"] == 32 and model.mixture.fv_dim == 2 * 4 * 50
    data = load_split(load_dataset_config("synth", tiny_synth.config_dir), "val")
    with h5py.File(tiny_hglmm["dir"] / "val.h5", "r") as f:
        assert f["features"].shape == (60, 32)
        assert f["caption_index"][:].tolist() == list(range(60))
        assert f["caption_image"][:].tolist() == data.caption_image.tolist()
        assert [c.decode() for c in f["captions"][:]] == data.captions
        assert f.attrs["model_sha256"] == model.checksum() and f.attrs["components"] == 4
    # a saved model with other settings is not silently reused
    rc = xmr_main(["text-features", "--dataset", "synth", "--splits", "val", "--out-dir", str(tiny_hglmm["dir"]),
                   "--config-dir", str(tiny_hglmm["config_dir"]), "--set", "pca_dim=16", "--no-progress"])
    assert rc == 2


def test_precomputed_encoder_reads_rows_and_checks_captions(tiny_hglmm):
    enc = PrecomputedTextEncoder({"features_dir": str(tiny_hglmm["dir"])}, 32)
    assert enc.out_dim == 32
    with h5py.File(tiny_hglmm["dir"] / "test.h5", "r") as f:
        caps = [c.decode() for c in f["captions"][:]]
        rows = f["features"][:]
    batch = enc.collate([caps[7], caps[3], caps[7]], [[]] * 3, [7, 3, 7], "test")
    feats, lengths = enc(batch)
    assert feats.shape == (3, 1, 32) and lengths.tolist() == [1, 1, 1]
    np.testing.assert_array_equal(feats[:, 0].numpy(), rows[[7, 3, 7]])
    with pytest.raises(XmrError, match="row 3 holds caption"):
        enc.collate([caps[2]], [[]], [3], "test")


def test_rrf_trains_on_tiny_synth_with_hglmm(tiny_synth, tiny_hglmm, tmp_path):
    recipe = tiny_synth.recipe("rrf", model={"embed_dim": 32, "hidden_dim": 64, "steps": 2},
                               loss={"n_neg": 5}, text={"features_dir": str(tiny_hglmm["dir"])},
                               optim={"lr": 0.05}, train={"epochs": 2, "batch_size": 16})
    cfg = load_run_config(recipe)
    summary = train(cfg, tmp_path / "run", progress=False)
    assert len(summary["history"]) == 2 and all(np.isfinite(r["loss"]) for r in summary["history"])
    sims, info = score_split(tmp_path / "run", progress=False)
    assert sims.shape == (12, 60) and np.isfinite(sims).all() and np.abs(sims).max() <= 1 + 1e-5
    # Caffe multipliers: biases (and BN betas) at 2x lr without weight decay
    model = RRFNet.from_config(cfg, 1280, None)
    groups = {g["name"]: g for g in model.param_groups(0.05, 0.1)}
    assert groups["main_bias"]["lr"] == pytest.approx(0.1) and groups["main_bias"]["weight_decay"] == 0.0
    assert "weight_decay" not in groups["main"]
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(names[id(p)].endswith("bias") for p in groups["main_bias"]["params"])


def test_recipes_name_their_text_feature_files():
    files = recipe_text_feature_files("f30k", "rrf", REPO / "config")
    assert files == {"train": ["features/f30k/hglmm/train.h5", "features/f30k/hglmm/val.h5"],
                     "score": ["features/f30k/hglmm/test.h5"]}
    assert recipe_text_feature_files("synth", "vsepp", REPO / "config") == {"train": [], "score": []}
    cfg = load_run_config(REPO / "config" / "recipes" / "coco" / "rrf.yaml")
    assert cfg["features"]["backbone"] == "resnet152_224" and cfg["loss"]["weights"] == [1.0, 0.5, 2.0, 1.0]
