"""The total training loss of PVSE, DivE and PCME, recomputed from their embeddings with naive float64 loops
written from the method cards (not with the library's loss functions): which tensors each term reads, the
weights, reductions and the sibling-caption mask. Each loss function alone is checked by hand in
test_set_losses.py / test_pcme.py; this checks how the methods put them together."""

import math

import numpy as np
import pytest
import torch

from xmr.run.config import load_run_config
from xmr.methods import METHODS
from xmr.text.vocab import SPECIALS

VOCAB = list(SPECIALS) + ["a", "red", "blue", "circle", "square"]
CAPTIONS = [["a", "red", "circle"], ["red", "circle"], ["a", "blue", "square"], ["blue", "circle", "a", "red"]]
# batch rows 0 and 1 are two captions of the same image: (0, 1) and (1, 0) are positives, never negatives
POS = torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]], dtype=torch.bool)


def build(tiny_synth, method, **sections):
    cfg = load_run_config(tiny_synth.recipe(method, name=f"{method}_loss_unit",
                                            text={"word_vectors": None, "word_dim": 8}, **sections))
    torch.manual_seed(0)
    return METHODS.get(method).from_config(cfg, 12, VOCAB).train()


def batch(model):
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(4, 5, 12, generator=g)
    nr = torch.tensor([5, 5, 3, 4])
    feats[2, 3:] = 0
    feats[3, 4:] = 0
    feats[1] = feats[0]  # the same image twice
    return feats, nr, model.text.collate([" ".join(c) for c in CAPTIONS], CAPTIONS)


# -- naive formulas (float64 numpy) ------------------------------------------------------------------------------

def unit(x):
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def cosines(xs, ys):
    return np.array([[float(a @ b) for b in unit(ys)] for a in unit(xs)])


def mil(img, txt):
    """PVSE: s(i, j) = max over element pairs of the cosine."""
    return np.array([[cosines(x, y).max() for y in txt] for x in img])


def smooth_chamfer(img, txt, alpha):
    """DivE Eq. 6-7: 1/(2αK) Σ_x log Σ_y e^{αc} + 1/(2αL) Σ_y log Σ_x e^{αc}."""
    out = np.zeros((len(img), len(txt)))
    for i, x in enumerate(img):
        for j, y in enumerate(txt):
            c = cosines(x, y)
            k, n = c.shape
            out[i, j] = (sum(math.log(sum(math.exp(alpha * v) for v in row)) for row in c) / (2 * alpha * k)
                         + sum(math.log(sum(math.exp(alpha * c[a, b]) for a in range(k))) for b in range(n))
                         / (2 * alpha * n))
    return out


def hardest_triplet_mean(s, pos, margin):
    """VSE++ hardest negative, both directions, summed then divided by the batch size."""
    b = len(s)
    total = 0.0
    for i in range(b):
        total += max([0.0] + [margin + s[i, j] - s[i, i] for j in range(b) if not pos[i, j]])
        total += max([0.0] + [margin + s[j, i] - s[i, i] for j in range(b) if not pos[j, i]])
    return total / b


def summed_triplet(s, pos, margin, per_direction):
    """Summed hinges (VSE0) over every negative, both directions; each direction's sum divided by
    ``per_direction`` (PVSE code: B * B entries of the hinge matrix; DivE code: the number of negatives)."""
    b = len(s)
    total = 0.0
    for i in range(b):
        for j in range(b):
            if not pos[i, j]:
                total += max(0.0, margin + s[i, j] - s[i, i]) + max(0.0, margin + s[i, j] - s[j, j])
    return total / per_direction


def mmd(x, y, gamma):
    """Biased MMD with k(a, b) = exp(-γ‖a - b‖) (non-squared distance, PVSE/DivE code)."""
    def k(p, q):
        return np.mean([[math.exp(-gamma * np.linalg.norm(a - b)) for b in q] for a in p])
    return k(x, x) - 2 * k(x, y) + k(y, y)


def gram_diversity(res):
    """PVSE: mean over samples of ‖G - diag G‖_F / K² of the unit residuals."""
    vals = []
    for r in res:
        g = unit(r) @ unit(r).T
        np.fill_diagonal(g, 0.0)
        vals.append(np.sqrt((g ** 2).sum()) / len(r) ** 2)
    return float(np.mean(vals))


def uniformity(slots, scale):
    """DivE: mean over samples of the mean over unordered pairs of exp(-scale‖x - x'‖²), unit slots."""
    vals = []
    for s in slots:
        u = unit(s)
        k = len(u)
        vals.append(np.mean([math.exp(-scale * np.sum((u[a] - u[b]) ** 2)) for a in range(k) for b in range(a + 1, k)]))
    return float(np.mean(vals))


def np64(t):
    return t.detach().double().numpy()


# -- PVSE --------------------------------------------------------------------------------------------------------

def test_pvse_loss_is_mil_triplet_plus_weighted_gram_diversity_and_mmd(tiny_synth):
    model = build(tiny_synth, "pvse", model={"num_embeds": 3},
                  loss={"margin": 0.3, "div_weight": 0.3, "mmd_weight": 0.7, "mmd_gamma": 0.5})
    fwd = model(*batch(model))
    img, txt = fwd["img"], fwd["txt"]
    out = model.compute_loss(fwd, POS, 1.0)  # after the warm-up epoch: the hardest negative
    i, t = np64(img), np64(txt)
    ranking = hardest_triplet_mean(mil(i, t), POS.numpy(), 0.3)
    div = gram_diversity(np64(fwd["image_residuals"])) + gram_diversity(np64(fwd["text_residuals"]))
    m = mmd(i.reshape(-1, i.shape[-1]), t.reshape(-1, t.shape[-1]), 0.5)
    assert out["ranking"].item() == pytest.approx(ranking, rel=1e-5)
    assert out["diversity"].item() == pytest.approx(div, rel=1e-5)
    assert out["mmd"].item() == pytest.approx(m, rel=1e-4, abs=1e-7)
    assert out["loss"].item() == pytest.approx(ranking + 0.3 * div + 0.7 * m, rel=1e-5)
    assert div > 0 and ranking > 0  # the fixture exercises every term
    # K = 1: no diversity and no MMD (both are defined on sets only)
    single = build(tiny_synth, "pvse", model={"num_embeds": 1}, loss={"margin": 0.3})
    fwd = single(*batch(single))
    img, txt = fwd["img"], fwd["txt"]
    out = single.compute_loss(fwd, POS, 0.0)
    assert set(out) == {"loss", "ranking"}
    assert out["loss"].item() == pytest.approx(hardest_triplet_mean(mil(np64(img), np64(txt)), POS.numpy(), 0.3),
                                                rel=1e-5)


def test_pvse_summed_hinges_average_over_all_b_by_b_entries_like_its_code(tiny_synth):
    # yalesong/pvse PVSELoss(reduction='mean'): (margin + S - d).clamp(0), positives zeroed, then .mean() over all
    # B x B entries per direction; batch of 4 => each direction's sum / 16 (xmr's old reduction divided by 4)
    model = build(tiny_synth, "pvse", model={"num_embeds": 3},
                  loss={"margin": 0.3, "div_weight": 0.0, "mmd_weight": 0.0, "max_violation": False})
    fwd = model(*batch(model))
    img, txt = fwd["img"], fwd["txt"]
    out = model.compute_loss(fwd, POS, 0.0)
    sims = mil(np64(img), np64(txt))
    assert out["ranking"].item() == pytest.approx(summed_triplet(sims, POS.numpy(), 0.3, 16), rel=1e-5)
    assert out["ranking"].item() > 0


# -- DivE --------------------------------------------------------------------------------------------------------

def test_dive_summed_hinges_average_over_the_negatives_like_its_code(tiny_synth):
    # kdwonn/DivE AsymmetricTripletLoss: positives cut out, (margin + neg - pos).clamp(0).mean() over the
    # (anchor, negative) pairs per direction; batch of 4 with POS's 6 positives => 16 - 6 = 10 negatives, sum / 10
    model = build(tiny_synth, "dive",
                  model={"num_embeds": 3, "iterations": 2, "heads": 2, "dim_head": 8, "dropout": 0.0},
                  loss={"margin": 0.2, "alpha": 16.0, "mmd_weight": 0.0, "div_weight": 0.0, "max_violation": False})
    fwd = model(*batch(model))
    img, txt = fwd["img"], fwd["txt"]
    out = model.compute_loss(fwd, POS, 0.0)
    sims = smooth_chamfer(np64(img), np64(txt), 16.0)
    assert out["ranking"].item() == pytest.approx(summed_triplet(sims, POS.numpy(), 0.2, 10), rel=1e-5)
    assert out["ranking"].item() > 0

def test_dive_loss_is_smooth_chamfer_triplet_plus_mmd_and_slot_uniformity(tiny_synth):
    model = build(tiny_synth, "dive",
                  model={"num_embeds": 3, "iterations": 2, "heads": 2, "dim_head": 8, "dropout": 0.0},
                  loss={"margin": 0.2, "alpha": 16.0, "mmd_weight": 0.4, "div_weight": 0.3, "div_scale": 2.0})
    fwd = model(*batch(model))
    img, txt = fwd["img"], fwd["txt"]
    out = model.compute_loss(fwd, POS, 1.0)  # after the warm-up epoch: the hardest negative
    i, t = np64(img), np64(txt)
    ranking = hardest_triplet_mean(smooth_chamfer(i, t, 16.0), POS.numpy(), 0.2)
    m = mmd(i.reshape(-1, i.shape[-1]), t.reshape(-1, t.shape[-1]), 0.5)
    # the diversity term reads the slots before the global feature is added (card §4.3), not the embeddings
    div = uniformity(np64(fwd["image_slots"]), 2.0) + uniformity(np64(fwd["text_slots"]), 2.0)
    assert out["ranking"].item() == pytest.approx(ranking, rel=1e-5)
    assert out["mmd"].item() == pytest.approx(m, rel=1e-4, abs=1e-7)
    assert out["diversity"].item() == pytest.approx(div, rel=1e-5)
    assert out["loss"].item() == pytest.approx(ranking + 0.4 * m + 0.3 * div, rel=1e-5)
    assert abs(div - (uniformity(i, 2.0) + uniformity(t, 2.0))) > 1e-3  # slots and embeddings do differ here


# -- PCME --------------------------------------------------------------------------------------------------------

def logistic(x):
    return 1.0 / (1.0 + math.exp(-x))


def soft_contrastive(zi, zt, pos, a, b, k):
    """Σ over pairs of -log p(match) (positives) or -log(1 - p(match)) (others), p = mean over J×J sample
    pairs of logistic(k·(-a‖z_i - z_j‖ + b))."""
    total = 0.0
    for i in range(len(zi)):
        for j in range(len(zt)):
            p = np.mean([logistic(k * (-a * np.linalg.norm(u - v) + b)) for u in zi[i] for v in zt[j]])
            total += -math.log(p if pos[i, j] else 1.0 - p)
    return total


def kl_standard(mu, log_sigma):
    """Σ ½ (μ² + σ² - 1 - 2 log σ)."""
    return float(0.5 * np.sum(mu ** 2 + np.exp(2 * log_sigma) - 1 - 2 * log_sigma))


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_pcme_loss_is_soft_contrastive_twice_plus_beta_kl_and_uniformity(tiny_synth, reduction):
    model = build(tiny_synth, "pcme", model={"num_samples": 2, "init_scale": 2.0, "init_shift": 1.0,
                                             "text_sigma_branch": "linear"},
                  loss={"vib_beta": 0.5, "reduction": reduction, "uniform_weight": 0.3})
    fwd = model(*batch(model))
    img, txt = fwd["img"], fwd["txt"]
    assert img.shape == (4, 2, 32)  # [μ, log σ]
    torch.manual_seed(7)
    out = model.compute_loss(fwd, POS, 0.0)
    # the same draws: image noise first, then caption noise, (B, J, D) each
    torch.manual_seed(7)
    eps_i, eps_t = torch.randn(4, 2, 32).double().numpy(), torch.randn(4, 2, 32).double().numpy()
    mu_i, ls_i, mu_t, ls_t = np64(img[:, 0]), np64(img[:, 1]), np64(txt[:, 0]), np64(txt[:, 1])
    zi = mu_i[:, None] + np.exp(ls_i)[:, None] * eps_i
    zt = mu_t[:, None] + np.exp(ls_t)[:, None] * eps_t
    match = soft_contrastive(zi, zt, POS.numpy(), 2.0, 1.0, 2.0)  # released σ: logistic(2x)
    kl = kl_standard(mu_i, ls_i) + kl_standard(mu_t, ls_t)
    if reduction == "mean":
        match, kl = match / 16, kl / 4  # over the 4 x 4 pairs; over the 4 items
    pts = np.concatenate([zi.reshape(-1, 32), zt.reshape(-1, 32)])  # 16 points
    unif = math.log(np.mean([math.exp(-2 * np.sum((pts[a] - pts[b]) ** 2))
                             for a in range(16) for b in range(a + 1, 16)]))
    assert out["kl"].item() == pytest.approx(kl, rel=1e-5)
    assert out["match_pos"].item() + out["match_neg"].item() == pytest.approx(match, rel=1e-4)
    assert out["uniformity"].item() == pytest.approx(unif, rel=1e-4)
    # the released code counts i2t and t2i: the same pairs twice
    assert out["loss"].item() == pytest.approx(2 * match + 0.5 * kl + 0.3 * unif, rel=1e-4)
