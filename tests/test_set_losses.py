"""Set similarities and set losses against values worked out by hand (or by a naive loop) on tiny inputs."""

import math

import pytest
import torch

from xmr.losses.orthogonal import dynamic_orthogonal_loss
from xmr.losses.set_regularizers import gram_diversity, mmd_rbf, pairwise_uniformity
from xmr.losses.triplet import triplet_loss
from xmr.losses.variance_aware import subembedding_sigma, variance_aware_loss
from xmr.similarity.measures import set_similarity

R2 = math.sqrt(2.0)


def unit(*v):
    t = torch.tensor(v, dtype=torch.float64)
    return t / t.norm()


# ---- set similarities ------------------------------------------------------------------------------------
def test_mil_and_smooth_chamfer_by_hand():
    # image set {e1, e2}, caption set {e1}: cosines c = [1, 0]
    img = torch.stack([unit(1, 0), unit(0, 1)])[None]
    cap = unit(1, 0)[None, None]
    assert set_similarity(img, cap, "max").item() == pytest.approx(1.0)
    # α = 1: 1/(2·2) (LSE{1} + LSE{0}) + 1/(2·1) LSE{1, 0} = (1 + 0)/4 + log(e + 1)/2
    expected = 0.25 + 0.5 * math.log(math.e + 1)
    assert set_similarity(img, cap, "smooth_chamfer", alpha=1.0).item() == pytest.approx(expected, abs=1e-9)
    # α = 16 (DivE): 1/64 (16 + 0) + 1/32 · log(e^16 + 1)
    expected16 = (16 + 0) / 64 + math.log(math.exp(16) + 1) / 32
    assert set_similarity(img, cap, "smooth_chamfer", alpha=16.0).item() == pytest.approx(expected16, abs=1e-9)


def test_smooth_chamfer_matches_eq6_loop():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 5, generator=g, dtype=torch.float64)
    y = torch.randn(2, 3, 5, generator=g, dtype=torch.float64)
    got = set_similarity(x, y, "smooth_chamfer", alpha=4.0)
    for i in range(3):
        for j in range(2):
            c = [[float(torch.dot(a / a.norm(), b / b.norm())) for b in y[j]] for a in x[i]]
            s1 = sum(math.log(sum(math.exp(4 * v) for v in row)) for row in c) / (2 * 4 * 4)
            s2 = sum(math.log(sum(math.exp(4 * c[a][b]) for a in range(4))) for b in range(3)) / (2 * 4 * 3)
            assert got[i, j].item() == pytest.approx(s1 + s2, abs=1e-9)


def test_dive_triplet_over_smooth_chamfer_by_hand():
    # two images, two captions, all single-element sets except image 0 = {e1, e2}; α = 1, margin 0.2
    img = torch.stack([torch.stack([unit(1, 0), unit(0, 1)]), torch.stack([unit(0, 1), unit(0, 1)])])
    cap = torch.stack([unit(1, 0)[None], unit(1, 1)[None]])
    s = set_similarity(img, cap, "smooth_chamfer", alpha=1.0)
    c = 1 / R2  # cos(45°)
    s00 = 0.25 + 0.5 * math.log(math.e + 1)                                     # as in the test above
    s01 = (c + c) / 4 + 0.5 * math.log(2 * math.exp(c))                         # both elements at 45°
    s10 = (0 + 0) / 4 + 0.5 * math.log(2)                                       # both orthogonal to e1
    s11 = (c + c) / 4 + 0.5 * math.log(2 * math.exp(c))
    assert torch.allclose(s, torch.tensor([[s00, s01], [s10, s11]], dtype=s.dtype), atol=1e-9)
    # hardest negative (one per anchor), summed: i2t rows and t2i columns
    hinge = lambda v: max(0.0, v)  # noqa: E731
    expected = (hinge(0.2 + s01 - s00) + hinge(0.2 + s10 - s11)      # image anchors
                + hinge(0.2 + s10 - s00) + hinge(0.2 + s01 - s11))   # caption anchors
    assert triplet_loss(s, margin=0.2).item() == pytest.approx(expected, abs=1e-9)
    assert triplet_loss(s, margin=0.2, reduction="mean").item() == pytest.approx(expected / 2, abs=1e-9)


# ---- regularisers ----------------------------------------------------------------------------------------
def test_mmd_by_hand():
    x, y = unit(1, 0)[None], unit(0, 1)[None]
    # k(x,x) = k(y,y) = 1, k(x,y) = exp(-0.5 · √2)
    assert mmd_rbf(x, y, gamma=0.5).item() == pytest.approx(2 - 2 * math.exp(-0.5 * R2), abs=1e-9)
    assert mmd_rbf(x, y, gamma=0.5, squared_distance=True).item() == pytest.approx(2 - 2 * math.exp(-1.0), abs=1e-9)
    assert mmd_rbf(x, x).item() == pytest.approx(0.0, abs=1e-12)
    # two samples each: x = {e1, e2}, y = {e1, e1}; mean over all pairs of each block
    x2, y2 = torch.stack([unit(1, 0), unit(0, 1)]), torch.stack([unit(1, 0), unit(1, 0)])
    kxy = math.exp(-0.5 * R2)
    expected = (2 + 2 * kxy) / 4 - 2 * (2 + 2 * kxy) / 4 + 1.0
    assert mmd_rbf(x2, y2).item() == pytest.approx(expected, abs=1e-9)


def test_diversity_losses_by_hand():
    s = torch.stack([unit(1, 0), unit(0, 1), unit(2, 0)])[None]  # third element parallel to the first
    # DivE: pairs (1,2): ‖·‖² = 2 -> e^-4; (1,3): 0 -> 1; (2,3): e^-4; mean of three
    assert pairwise_uniformity(s, 2.0).item() == pytest.approx((1 + 2 * math.exp(-4)) / 3, abs=1e-9)
    # PVSE: off-diagonal Gram has two ones -> Frobenius √2, divided by K² = 9
    assert gram_diversity(s).item() == pytest.approx(R2 / 9, abs=1e-9)
    # batch mean: a second, fully orthogonal set contributes 0 (Gram) and e^-4 (uniformity)
    s2 = torch.cat([s, torch.stack([unit(1, 0), unit(0, 1), unit(-1, 0)])[None]])
    # second set {e1, e2, -e1}: distances² 2, 4, 2 -> e^-4, e^-8, e^-4; Gram off-diag: -1 twice -> √2/9
    assert pairwise_uniformity(s2).item() == pytest.approx(
        ((1 + 2 * math.exp(-4)) / 3 + (2 * math.exp(-4) + math.exp(-8)) / 3) / 2, abs=1e-9)
    assert gram_diversity(s2).item() == pytest.approx(R2 / 9, abs=1e-9)


# ---- DVSE: L_dc ------------------------------------------------------------------------------------------
V3 = torch.stack([unit(1, 0), unit(0, 1), unit(1, 1)])[None]  # |cos|: c12 = 0, c13 = c23 = 1/√2


def test_dynamic_orthogonal_loss_by_hand():
    c = 1 / R2
    # mean over 6 ordered pairs: (0 + c + c) · 2 / 6
    assert dynamic_orthogonal_loss(V3, None, 0.4, "mean").item() == pytest.approx(2 * c / 3 - 0.4, abs=1e-9)
    assert dynamic_orthogonal_loss(V3, None, 0.4, "sum").item() == pytest.approx(4 * c - 0.4, abs=1e-9)
    assert dynamic_orthogonal_loss(V3, None, 0.4, "per_pair").item() == pytest.approx(4 * (c - 0.4), abs=1e-9)
    # mask (1, 0, 1): only the pair (1, 3) in both orders
    m = torch.tensor([[1.0, 0.0, 1.0]])
    assert dynamic_orthogonal_loss(V3, m, 0.4, "mean").item() == pytest.approx(c - 0.4, abs=1e-9)
    assert dynamic_orthogonal_loss(V3, m, 0.4, "sum").item() == pytest.approx(2 * c - 0.4, abs=1e-9)
    # a single active sub-embedding has no pairs: the hinge is [0 - β]_+ = 0
    assert dynamic_orthogonal_loss(V3, torch.tensor([[0.0, 1.0, 0.0]]), 0.4).item() == 0.0
    # β above the mean correlation switches the hinge off
    assert dynamic_orthogonal_loss(V3, None, 0.5, "mean").item() == 0.0
    # raw dot products (unit_vectors=False) of scaled vectors: (1,0)·(3,3) = 3
    raw = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [3.0, 3.0]]], dtype=torch.float64)
    assert dynamic_orthogonal_loss(raw, m, 0.4, "sum", unit_vectors=False).item() == pytest.approx(6 - 0.4)
    # batch: sum (default) and mean over images
    two = torch.cat([V3, V3])
    assert dynamic_orthogonal_loss(two, torch.cat([m, m]), 0.4).item() == pytest.approx(2 * (c - 0.4), abs=1e-9)
    assert dynamic_orthogonal_loss(two, torch.cat([m, m]), 0.4, reduction="mean").item() == pytest.approx(
        c - 0.4, abs=1e-9)


# ---- DVSE: σ and L_var -----------------------------------------------------------------------------------
def dvse_sims():
    """S[i, k, j] = S(v_i^k, t_j) for 3 images × 2 sub-embeddings × 3 captions."""
    s = torch.zeros(3, 2, 3, dtype=torch.float64)
    s[:, 0, :] = torch.tensor([[0.9, 0.2, 0.4], [0.1, 0.8, 0.3], [0.5, 0.0, 0.65]], dtype=torch.float64)
    s[:, 1, :] = torch.tensor([[0.6, 0.6, 0.0], [0.2, 0.5, 0.2], [0.1, 0.3, 0.9]], dtype=torch.float64)
    return s


# σ = unbiased std over the two non-target captions + 1 = |a - b| / √2 + 1
SIGMA = [[1 + 0.2 / R2, 1 + 0.6 / R2], [1 + 0.2 / R2, 1.0], [1 + 0.5 / R2, 1 + 0.2 / R2]]


def test_sigma_by_hand():
    assert torch.allclose(subembedding_sigma(dvse_sims()), torch.tensor(SIGMA, dtype=torch.float64), atol=1e-12)
    # column: std over the other images' k-th sub-embeddings for caption i, e.g. caption 0, k 0: {0.1, 0.5}
    col = [[1 + 0.4 / R2, 1 + 0.1 / R2], [1 + 0.2 / R2, 1 + 0.3 / R2], [1 + 0.1 / R2, 1 + 0.2 / R2]]
    assert torch.allclose(subembedding_sigma(dvse_sims(), direction="column"), torch.tensor(col, dtype=torch.float64),
                          atol=1e-12)
    # softmax source: std of the softmax over all three captions, without the target's probability
    s = dvse_sims()
    p = torch.softmax(s[0, 0], 0)
    assert subembedding_sigma(s, source="softmax")[0, 0].item() == pytest.approx(
        1 + abs(p[1] - p[2]).item() / R2, abs=1e-12)


def test_variance_aware_loss_by_hand():
    # hinges (margin 0.2): i2t (2,0) = 0.2 + 0.5 - 0.65 = 0.05; i2t (0,1) = 0.2 + 0.6 - 0.6 = 0.2;
    # t2i (caption 1, k 1) = 0.2 + 0.6 - 0.5 = 0.3; every other hinge is negative
    hinge_terms = 0.05 / SIGMA[2][0] ** 2 + 0.2 / SIGMA[0][1] ** 2 + 0.3 / SIGMA[1][1] ** 2
    log_terms = 2 * sum(math.log(v) for row in SIGMA for v in row)  # log σ in both directions
    out = variance_aware_loss(dvse_sims(), margin=0.2)
    assert out["loss"].item() == pytest.approx(hinge_terms + log_terms, abs=1e-9)
    assert out["loss"].item() == pytest.approx(2.5323, abs=1e-4)  # the same number, worked out on paper
    assert variance_aware_loss(dvse_sims(), margin=0.2, reduction="mean")["loss"].item() == pytest.approx(
        (hinge_terms + log_terms) / 3, abs=1e-9)
    # w/o L_var (Table V): σ ≡ 1, no log term -> plain per-slot triplet hinges
    plain = variance_aware_loss(dvse_sims(), margin=0.2, weighting=False)["loss"].item()
    assert plain == pytest.approx(0.05 + 0.2 + 0.3, abs=1e-9)
    # drop_terms: only active (i, k) count; deactivate (0, 1) and (1, 1)
    active = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 1.0]])
    assert variance_aware_loss(dvse_sims(), margin=0.2, weighting=False, active=active)["loss"].item() == \
        pytest.approx(0.05, abs=1e-9)


def test_variance_aware_options_match_naive_loop():
    s = dvse_sims()
    s[2, 1, 1] = 0.35
    pos = torch.eye(3, dtype=torch.bool)
    pos[0, 1] = True  # caption 1 also belongs to image 0: not a negative, still in σ's sample
    for t2i_sigma in ("image_row", "column"):
        for negatives in ("slotwise", "set"):
            got = variance_aware_loss(s, pos, 0.2, t2i_sigma=t2i_sigma, t2i_negatives=negatives)["loss"].item()
            total = 0.0
            for i in range(3):
                for k in range(2):
                    d = s[i, k, i].item()
                    row = [s[i, k, j].item() for j in range(3) if j != i]
                    col = [s[j, k, i].item() for j in range(3) if j != i]
                    sr = 1 + torch.tensor(row, dtype=torch.float64).std().item()
                    sc = sr if t2i_sigma == "image_row" else 1 + torch.tensor(col, dtype=torch.float64).std().item()
                    neg_i2t = max(s[i, k, j].item() for j in range(3) if not pos[i, j])
                    cands = [s[j, kk, i].item() for j in range(3) if not pos[j, i]
                             for kk in ([k] if negatives == "slotwise" else [0, 1])]
                    h_t2i = max(0.0, 0.2 + max(cands) - d)
                    total += max(0.0, 0.2 + neg_i2t - d) / sr ** 2 + math.log(sr) + h_t2i / sc ** 2 + math.log(sc)
            assert got == pytest.approx(total, abs=1e-9), (t2i_sigma, negatives)


def test_variance_aware_summed_hinges_by_hand():
    # warm-up form (hardest=False): every negative's hinge is summed instead of the hardest one taken.
    # Two extra violations on top of dvse_sims(): S[2,0,1] = 0.6 and S[2,1,1] = 0.35.
    s = dvse_sims()
    s[2, 0, 1], s[2, 1, 1] = 0.6, 0.35
    # i2t (2,0): d = 0.65, hinges 0.2+0.5-0.65 = 0.05 (caption 0) and 0.2+0.6-0.65 = 0.15 (caption 1);
    # i2t (0,1): d = 0.6, 0.2+0.6-0.6 = 0.2 (caption 1). t2i caption 1, k 1: d = 0.5, images 0 and 2:
    # 0.2+0.6-0.5 = 0.3 and 0.2+0.35-0.5 = 0.05. Every other hinge is <= 0.
    summed = variance_aware_loss(s, margin=0.2, weighting=False, hardest=False)
    assert summed["loss"].item() == pytest.approx((0.05 + 0.15) + 0.2 + (0.3 + 0.05), abs=1e-9)
    assert summed["hinge_i2t"][2, 0].item() == pytest.approx(0.2, abs=1e-9)
    assert summed["hinge_t2i"][1, 1].item() == pytest.approx(0.35, abs=1e-9)
    hardest = variance_aware_loss(s, margin=0.2, weighting=False)
    assert hardest["loss"].item() == pytest.approx(0.15 + 0.2 + 0.3, abs=1e-9)
    # set negatives: image j's best slot max_k' S[j, k', i]; caption 0: images 1, 2 -> 0.2, 0.5, k 1 (d 0.6):
    # 0.2+0.5-0.6 = 0.1; caption 1: images 0, 2 -> 0.6, 0.6, k 1 (d 0.5): 0.3 + 0.3; caption 2: none
    set_sum = variance_aware_loss(s, margin=0.2, weighting=False, hardest=False, t2i_negatives="set")
    assert set_sum["loss"].item() == pytest.approx(0.4 + 0.1 + 0.6, abs=1e-9)
    # other positives are no negatives: caption 1 also belongs to image 0 -> i2t (0,1) and t2i via image 0 go
    pos = torch.eye(3, dtype=torch.bool)
    pos[0, 1] = True
    masked = variance_aware_loss(s, pos, margin=0.2, weighting=False, hardest=False)
    assert masked["loss"].item() == pytest.approx((0.05 + 0.15) + 0.05, abs=1e-9)
    # σ weighting and the log term act on the summed hinges exactly as on the hardest one
    sig = subembedding_sigma(s)
    weighted = variance_aware_loss(s, margin=0.2, hardest=False)["loss"].item()
    expected = (0.2 / sig[2, 0] ** 2 + 0.2 / sig[0, 1] ** 2 + 0.35 / sig[1, 1] ** 2 + 2 * sig.log().sum()).item()
    assert weighted == pytest.approx(expected, abs=1e-9)


def test_pvse_warmup_sums_hinges_then_takes_the_hardest(tiny_synth):
    from xmr.run.config import load_run_config
    from xmr.methods.base import METHODS

    vocab = ["<pad>", "<unk>", "<start>", "<end>", "a", "red", "circle", "blue", "square"]
    caps = [["a", "red", "circle"], ["a", "blue", "square"], ["red", "square"], ["blue", "circle"]]
    cfg = load_run_config(tiny_synth.recipe("pvse", name="pvse_warmup_unit", text={"word_vectors": None,
                                            "word_dim": 8}, loss={"warmup_epochs": 1, "div_weight": 0,
                                                                  "mmd_weight": 0}))
    torch.manual_seed(0)
    model = METHODS.get("pvse").from_config(cfg, 12, vocab).train()
    feats = torch.randn(4, 5, 12, generator=torch.Generator().manual_seed(1))
    fwd = model(feats, torch.tensor([5, 5, 3, 4]), model.text.collate([" ".join(c) for c in caps], caps))
    img, txt = fwd["img"], fwd["txt"]
    pos = torch.eye(4, dtype=torch.bool)
    sims = set_similarity(img, txt, "max")
    # margin 0.1, PVSE's mean over all B x B hinge entries (its default); epoch counts from 0, so [0, 1) is the
    # warm-up
    assert model.compute_loss(fwd, pos, 0.5)["loss"].item() == pytest.approx(
        triplet_loss(sims, pos, 0.1, False, "mean_pairs").item(), rel=1e-6)
    assert model.compute_loss(fwd, pos, 1.0)["loss"].item() == pytest.approx(
        triplet_loss(sims, pos, 0.1, True, "mean").item(), rel=1e-6)
    assert triplet_loss(sims, pos, 0.1, False, "mean_pairs").item() != pytest.approx(
        triplet_loss(sims, pos, 0.1, True, "mean").item())  # the two forms differ on this batch


def test_sigma_detach_controls_gradient():
    s = dvse_sims().requires_grad_(True)
    variance_aware_loss(s, margin=0.2)["loss"].backward()
    # detached σ: S[0,1,1] is the hardest negative of image 0's slot 1 (i2t, weight 1/σ_01²) and of caption 1's
    # slot 1 (t2i, weight 1/σ_11²); S[0,1,2] is no hardest negative -> no gradient
    assert s.grad[0, 1, 1].item() == pytest.approx(1 / SIGMA[0][1] ** 2 + 1 / SIGMA[1][1] ** 2, abs=1e-9)
    assert s.grad[0, 1, 2].item() == 0.0
    s2 = dvse_sims().requires_grad_(True)
    variance_aware_loss(s2, margin=0.2, detach_sigma=False)["loss"].backward()
    # with gradients through σ, S[0,1,2] moves σ_01 (and log σ_01) -> non-zero gradient
    assert s2.grad[0, 1, 2].item() != 0.0
