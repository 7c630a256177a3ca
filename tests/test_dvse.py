"""DVSE: the dynamic mask, where it acts, how the loss terms combine, the Table V switches, Fig. 6."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from xmr.cli import main as cli_main
from xmr.run.config import load_run_config
from xmr.losses.orthogonal import dynamic_orthogonal_loss
from xmr.losses.variance_aware import variance_aware_loss
from xmr.report.dvse_figures import plot_subembedding_correlation, subembedding_correlation
from xmr.inference.loaders import ImageDataset, collate_images, load_split_with_features
from xmr.train.trainer import train
from xmr.inference.model import load_trained, model_from_config
from xmr.settings.run_settings import run_settings

VOCAB = ["<pad>", "<unk>", "<start>", "<end>", "a", "red", "blue", "circle", "square", "big"]
CAPTIONS = [["a", "red", "circle"], ["a", "blue", "square"], ["big", "red", "square"], ["a", "circle"],
            ["blue", "circle"], ["a", "big", "blue", "square"]]


# the global branch h_V of each reading: the method file's VSE∞ base (GPO over projected regions) and PVSE's FC(mean)
BASES = {"vse_inf": {"image_projection": "per_region", "image_pool": "gpo", "text_pool": "gpo"},
         "pvse": {"image_projection": "pooled_fc", "image_pool": "mean", "text_pool": "mean"}}
NO_AUGMENT = {"size_augment": {"mode": "none"}, "text_augment": 0.0}  # these tests are about the losses and heads


def dvse_model(tiny_synth, image_dim=12, base="vse_inf", **sections):
    sections.setdefault("model", {})
    sections["model"] = {"num_embeds": 4, **BASES[base], **NO_AUGMENT, **sections["model"]}
    cfg = load_run_config(tiny_synth.recipe("dvse", name="dvse_unit", text={"word_vectors": None, "word_dim": 8},
                                            **sections))
    torch.manual_seed(0)
    return model_from_config(cfg, image_dim, VOCAB)


def global_term(model, feats, nr):
    """h_V(z) of either reading, from the model's own modules."""
    if model.model_settings.image_projection == "per_region":
        return model.image_pool(model.image_proj(feats), nr)
    return model.image_head.global_fc(torch.stack([feats[i, :n].mean(0) for i, n in enumerate(nr)]))


def image_pie(model):
    return model.image_pie if model.model_settings.image_projection == "per_region" else model.image_head.pie


def batch_inputs(model, b=6, r=5, f=12):
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(b, r, f, generator=g)
    num_regions = torch.tensor([5, 4, 5, 3, 5, 2])[:b]
    for i, n in enumerate(num_regions):
        feats[i, n:] = 0
    text = model.text.collate([" ".join(c) for c in CAPTIONS[:b]], CAPTIONS[:b])
    return feats, num_regions, text


def test_dynamic_mask_is_the_frozen_projection_sign(tiny_synth):
    model = dvse_model(tiny_synth).train()
    feats, nr, _ = batch_inputs(model)
    w = model.mask_projection
    assert w.shape == (4, 12) and not w.requires_grad
    assert "mask_projection" in model.state_dict()
    assert all("mask_projection" not in n for n, _ in model.named_parameters())
    pooled = torch.stack([feats[i, :n].mean(0) for i, n in enumerate(nr)])
    # round(sigmoid(x)) = 1 exactly when x > 0; an image with no active slot gets all of them
    want = (pooled @ w.T > 0).float()
    want[want.sum(1) == 0] = 1.0
    assert torch.equal(model.dynamic_mask(feats, nr), want)
    assert 0 < want.mean() < 1  # the mask does vary over slots and images here
    # the same seed gives the same W² (it is part of the recipe, not of the run's randomness)
    torch.manual_seed(123)
    assert torch.equal(dvse_model(tiny_synth).mask_projection, w)


@pytest.mark.parametrize("base", sorted(BASES))
def test_gate_mode_masked_slot_is_global_embedding(tiny_synth, base):
    model = dvse_model(tiny_synth, base=base).eval()
    feats, nr, _ = batch_inputs(model)
    emb = model.encode_image(feats, nr)
    mask = model.dynamic_mask(feats, nr)
    with torch.no_grad():
        only_global = F.normalize(image_pie(model).layer_norm(global_term(model, feats, nr)), dim=-1)
    off = (mask == 0).nonzero().tolist()
    assert off, "fixture should mask at least one slot"
    for i, k in off:
        assert torch.allclose(emb[i, k], only_global[i], atol=1e-5)
    on_i, on_k = (mask == 1).nonzero()[0].tolist()
    assert not torch.allclose(emb[on_i, on_k], only_global[on_i], atol=1e-3)


@pytest.mark.parametrize("base", sorted(BASES))
def test_layer_norm_position_and_residual_scale(tiny_synth, base):
    """model.layer_norm per_term: v^k = l2norm(LN(g) + m_k LN'(v̂^k)); model.residual_scale λ: l2norm(LN(g + λ m_k v̂^k));
    none: l2norm(g + m_k v̂^k); recomputed from the head's own parts; the image's global term and residuals are kept
    for the set statistics."""
    def by_hand(model, feats, nr, norm, scale):
        pie = image_pie(model)
        g = global_term(model, feats, nr)
        pooled, _ = pie.attention(feats, nr)
        res = torch.sigmoid(pie.fc(pooled))
        m = model.dynamic_mask(feats, nr)[..., None]
        if norm == "per_term":
            return F.normalize(pie.layer_norm(g)[:, None] + m * pie.residual_norm(res), dim=-1), g, res
        if norm == "none":
            return F.normalize(g[:, None] + scale * m * res, dim=-1), g, res
        return F.normalize(pie.layer_norm(g[:, None] + scale * m * res), dim=-1), g, res

    for norm, scale in (("sum", 1.0), ("sum", 4.0), ("per_term", 1.0), ("none", 1.0)):
        model = dvse_model(tiny_synth, base=base, model={"layer_norm": norm, "residual_scale": scale}).eval()
        with torch.no_grad():  # the second LayerNorm's affine away from identity, so that it is seen
            if norm == "per_term":
                image_pie(model).residual_norm.weight.uniform_(0.5, 2.0)
        feats, nr, _ = batch_inputs(model)
        with torch.no_grad():
            out = model.image_outputs(feats, nr)
            want, g, res = by_hand(model, feats, nr, norm, scale)
        assert torch.allclose(out["img"], want, atol=1e-5)
        assert torch.allclose(out["image_global"], g, atol=1e-6)
        assert torch.allclose(out["image_residuals"], res, atol=1e-6)
    # the recipes' reading (config/methods/dvse.yaml, the readings study) is per_term; the formula has one LayerNorm
    assert hasattr(image_pie(dvse_model(tiny_synth, base=base)), "residual_norm")
    assert not hasattr(image_pie(dvse_model(tiny_synth, base=base, model={"layer_norm": "sum"})), "residual_norm")
    assert isinstance(image_pie(dvse_model(tiny_synth, base=base, model={"layer_norm": "none"})).layer_norm,
                      torch.nn.Identity)


def test_loss_only_and_drop_terms_modes(tiny_synth):
    gate = dvse_model(tiny_synth).eval()
    loss_only = dvse_model(tiny_synth, model={"dynamic_mask": {"mode": "loss_only"}}).eval()
    drop = dvse_model(tiny_synth, model={"dynamic_mask": {"mode": "drop_terms"}}).eval()
    loss_only.load_state_dict(gate.state_dict())
    drop.load_state_dict(gate.state_dict())
    feats, nr, _ = batch_inputs(gate)
    mask = gate.dynamic_mask(feats, nr)
    ungated = loss_only.encode_image(feats, nr)  # loss_only: the mask does not touch the embeddings
    with torch.no_grad():
        out = image_pie(loss_only)(global_term(loss_only, feats, nr), feats, nr)
    assert torch.allclose(ungated, F.normalize(out["embeddings"], dim=-1))
    # drop_terms at test time: each masked slot repeats the first active one, so max over K = max over active
    dropped = drop.encode_image(feats, nr)
    for i in range(len(nr)):
        first = int(mask[i].argmax())
        for k in range(4):
            assert torch.allclose(dropped[i, k], ungated[i, k if mask[i, k] else first])


def test_total_loss_is_eta_weighted_sum(tiny_synth):
    """After the warm-up epoch (epoch 1.0 on): η · L_var (hardest negative) + (1 − η) · L_dc."""
    model = dvse_model(tiny_synth).train()
    feats, nr, text = batch_inputs(model)
    fwd = model(feats, nr, text)
    img, txt = fwd["img"], fwd["txt"]
    pos = torch.eye(6, dtype=torch.bool)
    pos[0, 3] = True  # caption 3 also belongs to image 0
    terms = model.compute_loss(fwd, pos, 1.0)
    residuals, mask = fwd["image_residuals"], fwd["mask"]
    l_var = variance_aware_loss(torch.einsum("bkd,cd->bkc", img, txt), pos, 0.2)["loss"]
    l_dc = dynamic_orthogonal_loss(residuals, mask, 0.4, "mean")
    assert terms["l_var"].item() == pytest.approx(l_var.item(), rel=1e-6)
    assert terms["l_dc"].item() == pytest.approx(l_dc.item(), rel=1e-6)
    assert terms["loss"].item() == pytest.approx(0.6 * l_var.item() + 0.4 * l_dc.item(), rel=1e-6)
    terms["loss"].backward()
    assert image_pie(model).attention.w1.weight.grad.abs().sum() > 0
    assert model.text_pie.fc.weight.grad.abs().sum() > 0
    assert model.image_pool.gpo.score.weight.grad.abs().sum() > 0  # the VSE∞ base learns with the sets
    # η is read from the config, not fixed at the paper's 0.6: η = 0.25 -> 0.25 L_var + 0.75 L_dc
    other = dvse_model(tiny_synth, loss={"eta": 0.25}).train()
    other.load_state_dict(model.state_dict())
    fwd = other(feats, nr, text)
    img, txt = fwd["img"], fwd["txt"]
    t = other.compute_loss(fwd, pos, 1.0)
    assert t["l_var"].item() == pytest.approx(l_var.item(), rel=1e-6)
    assert t["loss"].item() == pytest.approx(0.25 * l_var.item() + 0.75 * l_dc.item(), rel=1e-6)


def test_table_v_switches(tiny_synth):
    pos = torch.eye(6, dtype=torch.bool)
    # w/o L_var: plain per-slot triplet (σ ≡ 1, no log σ)
    m = dvse_model(tiny_synth, loss={"ranking": "triplet_per_slot"}).train()
    feats, nr, text = batch_inputs(m)
    fwd = m(feats, nr, text)
    img, txt = fwd["img"], fwd["txt"]
    t = m.compute_loss(fwd, pos, 1.0)
    plain = variance_aware_loss(torch.einsum("bkd,cd->bkc", img, txt), pos, 0.2, weighting=False)["loss"]
    assert t["l_var"].item() == pytest.approx(plain.item(), rel=1e-6)
    # w/o L_ort: no L_dc term
    m = dvse_model(tiny_synth, loss={"orthogonal": {"enabled": False}}).train()
    fwd = m(feats, nr, text)
    img, txt = fwd["img"], fwd["txt"]
    t = m.compute_loss(fwd, pos, 1.0)
    assert "l_dc" not in t and t["loss"].item() == pytest.approx(0.6 * t["l_var"].item(), rel=1e-6)
    # w/o DM: no mask; L_ort over all pairs
    m = dvse_model(tiny_synth, model={"dynamic_mask": {"enabled": False}}).train()
    fwd = m(feats, nr, text)
    img, txt = fwd["img"], fwd["txt"]
    t = m.compute_loss(fwd, pos, 1.0)
    assert fwd["mask"] is None and "mask_active" not in t
    assert t["l_dc"].item() == pytest.approx(dynamic_orthogonal_loss(fwd["image_residuals"], None).item(),
                                             rel=1e-6)
    # w/o SE: K = 1, nothing to decorrelate
    m = dvse_model(tiny_synth, model={"num_embeds": 1}).train()
    fwd = m(feats, nr, text)
    img, txt = fwd["img"], fwd["txt"]
    assert img.shape == (6, 1, 32) and "l_dc" not in m.compute_loss(fwd, pos, 1.0)
    # the "global only" reading: image = l2norm(LN(h_V(z))), h_V = FC(mean z) (PVSE) or GPO(proj(z)) (VSE∞)
    m = dvse_model(tiny_synth, base="pvse", model={"attention": False}).eval()
    img = m.encode_image(feats, nr)
    pooled = torch.stack([feats[i, :n].mean(0) for i, n in enumerate(nr)])
    assert torch.allclose(img[:, 0], F.normalize(m.image_norm(m.image_global(pooled)), dim=-1), atol=1e-6)
    m = dvse_model(tiny_synth, model={"attention": False}).eval()
    with torch.no_grad():
        want = F.normalize(m.image_norm(m.image_pool(m.image_proj(feats), nr)), dim=-1)
    assert torch.allclose(m.encode_image(feats, nr)[:, 0], want, atol=1e-6)
    # and the caption without its residual: t = l2norm(LN(h_T(z_t)))
    m = dvse_model(tiny_synth, model={"text_residual": False}).eval()
    with torch.no_grad():
        h, lengths = m.text(text)
        want = F.normalize(m.text_norm(m.text_pool(h, lengths)), dim=-1)
    assert not hasattr(m, "text_pie") and torch.allclose(m.encode_text(text), want, atol=1e-6)


def test_warmup_sums_hinges_before_the_hardest_negative(tiny_synth):
    # loss.warmup_epochs = 1: epochs [0, 1) use L_var with summed hinges, from epoch 1 on the hardest negative
    model = dvse_model(tiny_synth, loss={"warmup_epochs": 1, "orthogonal": {"enabled": False}}).train()
    feats, nr, text = batch_inputs(model)
    fwd = model(feats, nr, text)
    img, txt = fwd["img"], fwd["txt"]
    pos = torch.eye(6, dtype=torch.bool)
    sims = torch.einsum("bkd,cd->bkc", img, txt)
    summed = variance_aware_loss(sims, pos, 0.2, hardest=False)["loss"]
    hardest = variance_aware_loss(sims, pos, 0.2)["loss"]
    assert summed.item() > hardest.item()  # more than one violating negative in this batch
    assert model.compute_loss(fwd, pos, 0.99)["l_var"].item() == pytest.approx(summed.item(), rel=1e-6)
    assert model.compute_loss(fwd, pos, 1.0)["l_var"].item() == pytest.approx(hardest.item(), rel=1e-6)
    # 0 (the paper states no warm-up; the method file takes VSE∞'s 1): the hardest negative from the first step
    plain = dvse_model(tiny_synth, loss={"warmup_epochs": 0, "orthogonal": {"enabled": False}}).train()
    plain.load_state_dict(model.state_dict())
    fwd = plain(feats, nr, text)
    img, txt = fwd["img"], fwd["txt"]
    assert plain.compute_loss(fwd, pos, 0.0)["l_var"].item() == pytest.approx(hardest.item(), rel=1e-6)


def test_drop_terms_needs_max_similarity(tiny_synth):
    with pytest.raises(Exception, match="eval.similarity"):
        dvse_model(tiny_synth, model={"dynamic_mask": {"mode": "drop_terms"}}, eval={"similarity": "mean"})


@pytest.fixture(scope="module")
def trained_dvse(tiny_synth, module_tmp):
    out = module_tmp("dvse_run")
    cfg = load_run_config(tiny_synth.recipe("dvse", name="dvse_fig", model={"num_embeds": 3}))
    train(cfg, out, progress=False)
    return out


def test_subembedding_correlation_matrix(trained_dvse):
    m = subembedding_correlation(trained_dvse)
    assert m.shape == (3, 3)
    assert np.allclose(m, m.T) and np.allclose(np.diag(m), 1.0)
    # the mean over test images of each image's cosine matrix, recomputed by hand
    model, cfg = load_trained(trained_dvse)
    data, feats = load_split_with_features(run_settings(cfg).image, cfg["dataset_cfg"], "test")
    b = collate_images([ImageDataset(feats, list(range(data.num_images)))[i] for i in range(data.num_images)])
    with torch.no_grad():
        e = model.encode_image(b["feats"], b["num_regions"]).double()
    want = np.mean([(x @ x.T).numpy() for x in e], axis=0)
    assert np.allclose(m, want, atol=1e-6)
    r = subembedding_correlation(trained_dvse, "val", kind="residuals", absolute=True)
    assert r.shape == (3, 3) and np.allclose(np.diag(r), 1.0) and (r >= 0).all()


def test_correlation_figure_and_cli(trained_dvse, tmp_path):
    png = tmp_path / "fig.png"
    plot_subembedding_correlation(np.array([[1.0, 0.2], [0.2, 1.0]]), png, "two")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out, npy = tmp_path / "cli.png", tmp_path / "cli.npy"
    assert cli_main(["dvse-correlation", "--run", str(trained_dvse), "--out", str(out), "--npy", str(npy)]) == 0
    assert out.exists() and np.allclose(np.load(npy), subembedding_correlation(trained_dvse))
    with pytest.raises(Exception, match="square"):
        plot_subembedding_correlation(np.ones((2, 3)), tmp_path / "bad.png")


def test_centred_mask_uses_running_feature_mean(tiny_synth):
    model = dvse_model(tiny_synth, model={"dynamic_mask": {"center": True, "momentum": 0.5}}).train()
    feats, nr, _ = batch_inputs(model)
    pooled = torch.stack([feats[i, :n].mean(0) for i, n in enumerate(nr)])
    w = model.mask_projection
    # first training batch: the running mean starts at this batch's mean
    want = ((pooled - pooled.mean(0)) @ w.T > 0).float()
    want[want.sum(1) == 0] = 1.0
    assert torch.equal(model.dynamic_mask(feats, nr), want)
    # second batch: mean <- mean + 0.5 · (batch mean - mean); at test time the stored mean is used, not updated
    shifted = feats + 1.0 * (torch.arange(5)[None, :, None] < nr[:, None, None])
    model.dynamic_mask(shifted, nr)
    mean = pooled.mean(0) + 0.5 * ((pooled + 1).mean(0) - pooled.mean(0))
    assert torch.allclose(model.mask_feature_mean, mean, atol=1e-6)
    model.eval()
    model.dynamic_mask(shifted, nr)
    assert torch.allclose(model.mask_feature_mean, mean, atol=1e-6)


def test_orthogonal_target_embeddings(tiny_synth):
    m = dvse_model(tiny_synth, loss={"orthogonal": {"target": "embeddings", "mode": "sum"}}).train()
    feats, nr, text = batch_inputs(m)
    fwd = m(feats, nr, text)
    img = fwd["img"]
    t = m.compute_loss(fwd, torch.eye(6, dtype=torch.bool), 0.0)
    assert t["l_dc"].item() == pytest.approx(dynamic_orthogonal_loss(img, fwd["mask"], 0.4, "sum").item(),
                                             rel=1e-6)
    # the logged collapse diagnostic: mean |cos| over ordered pairs of distinct sub-embeddings
    x = F.normalize(img.detach(), dim=-1)
    want = np.mean([abs(float(x[b, i] @ x[b, j])) for b in range(6) for i in range(4) for j in range(4) if i != j])
    assert t["embedding_abs_cos"].item() == pytest.approx(want, rel=1e-5)
