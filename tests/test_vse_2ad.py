"""ADPOOL and ADOPT (VSE+2AD) against hand-computed values."""

import math

import pytest
import torch

from xmr.core.errors import XmrError
from xmr.losses.adaptive_objective import adopt_direction, adopt_loss, adopt_num_negatives
from xmr.models.adaptive_pool import AdaptivePool, kmax_pool


def softmax(xs):
    e = [math.exp(x) for x in xs]
    return [v / sum(e) for v in e]


# one sample with 2 valid tokens and a padding row (huge values that must never leak in); sorted per dimension:
# dim 0 -> [3, 1, pad 0], dim 1 -> [4, 2, pad 0]
X = torch.tensor([[[1.0, 4.0], [3.0, 2.0], [50.0, 60.0]]])
LEN = torch.tensor([2])


def pool(**kw):
    p = AdaptivePool(2, **kw)
    torch.nn.init.zeros_(p.token.weight)
    if p.token.bias is not None:
        torch.nn.init.zeros_(p.token.bias)
    return p


def test_embedding_level_is_softmax_weighted_per_dimension():
    p = pool(branches="embedding")
    w0, w1 = softmax([3, 1]), softmax([4, 2])
    expect = [w0[0] * 3 + w0[1] * 1, w1[0] * 4 + w1[1] * 2]
    assert p(X, LEN)[0].tolist() == pytest.approx(expect, rel=1e-6)


def test_token_level_per_dimension_weights_code_unmasked_and_masked():
    p = pool(branches="token")
    with torch.no_grad():
        p.token.weight.copy_(torch.tensor([[0.0, 1.0], [0.0, 0.0]]))  # logit of dim 0 = relu(value in dim 1)
    # dim 0: weights softmax(relu([4, 2, 0])) over the 3 positions (the code does not mask the padding row);
    # dim 1: logits 0 -> uniform 1/3 over the 3 positions
    w = softmax([4, 2, 0])
    assert p(X, LEN)[0].tolist() == pytest.approx([w[0] * 3 + w[1] * 1, (4 + 2) / 3], rel=1e-6)
    p.mask_pad = True
    w = softmax([4, 2])
    assert p(X, LEN)[0].tolist() == pytest.approx([w[0] * 3 + w[1] * 1, (4 + 2) / 2], rel=1e-6)


def test_token_level_scalar_weight_is_the_papers_reading():
    p = pool(branches="token", token_weight="scalar")
    with torch.no_grad():
        p.token.weight.copy_(torch.tensor([[-1.0, 0.0]]))  # one logit per token, no ReLU: -(value in dim 0)
    w = softmax([-3, -1, 0])  # padding row (0) takes mass in the unmasked default
    assert p(X, LEN)[0].tolist() == pytest.approx([w[0] * 3 + w[1] * 1, w[0] * 4 + w[1] * 2], rel=1e-6)


def test_balance_mixes_the_two_levels_with_a_learned_softmax_and_fixed_weights():
    p = pool()
    with torch.no_grad():
        p.balance.weight.copy_(torch.tensor([[1.0, 0.0]]))
        p.balance.bias.fill_(0.3)
    t_tok = [4 / 3, 2.0]  # zero token weights -> uniform over the 3 positions
    w0, w1 = softmax([3, 1]), softmax([4, 2])
    t_emb = [w0[0] * 3 + w0[1], w1[0] * 4 + w1[1] * 2]
    om = softmax([t_tok[0] + 0.3, t_emb[0] + 0.3])
    assert p(X, LEN)[0].tolist() == pytest.approx([om[0] * a + om[1] * b for a, b in zip(t_tok, t_emb)], rel=1e-6)
    fixed = pool(fixed_balance=[0.75, 0.25])
    assert fixed(X, LEN)[0].tolist() == pytest.approx([0.75 * a + 0.25 * b for a, b in zip(t_tok, t_emb)],
                                                      rel=1e-6)
    with pytest.raises(XmrError):
        AdaptivePool(2, fixed_balance=[0.5, 0.6])


def test_kmax_pool_averages_the_k_largest_valid_values():
    x = torch.tensor([[[1.0, 0.0], [3.0, -1.0], [2.0, 5.0]], [[7.0, 8.0], [9.0, 9.0], [9.0, 9.0]]])
    out = kmax_pool(x, torch.tensor([3, 1]), 2)
    assert out.tolist() == [[2.5, 2.5], [7.0, 8.0]]


def toy(b, a, s):
    return torch.full((b, b), s) + torch.eye(b) * (a - s)


@pytest.mark.parametrize("a,s,k_code,k_paper", [
    (0.0, 0.0, 70, 127), (0.9, 0.9, 22, 20), (0.3, 0.1, 39, 121), (0.5, 0.1, 6, 113), (0.7, 0.1, 1, 103),
    (0.8, 0.3, 1, 82)])
def test_k_rules_reproduce_the_method_card_table(a, s, k_code, k_paper):
    # B = 128, positives a, negatives s: the card's hand-computed K for both rules (§2.4)
    sims = toy(128, a, s)
    assert adopt_num_negatives(sims, "code", 1.25) == k_code
    assert adopt_num_negatives(sims, "paper") == k_paper


def test_negative_base_guard_and_the_codes_failure():
    sims = toy(4, -0.9, 1.0)  # align -0.9, unif (1 + 3 e^-1)/4 = 0.526 -> base < 0
    assert adopt_num_negatives(sims, "code", guard_negative_base=True) == 3  # base 0 -> cos 0 = 1 -> K = B-1
    with pytest.raises(XmrError, match="guard_negative_base"):
        adopt_num_negatives(sims, "code", guard_negative_base=False)


def test_adopt_direction_cross_entropy_over_hardest_negatives():
    s = torch.tensor([[0.5, 0.2, -0.1], [0.3, 0.6, 0.1], [0.0, 0.4, 0.8]])
    eye = torch.eye(3, dtype=torch.bool)
    # K = 1, τ 0.1, margin 0.2: logits [5, 4], [6, 5], [8, 6]
    expect = (2 * math.log(1 + math.exp(-1)) + math.log(1 + math.exp(-2))) / 3
    assert adopt_direction(s, eye, 1, 0.1, 0.2).item() == pytest.approx(expect, rel=1e-5)
    # K = 2: row 0 logits [5, 4, 1], row 1 [6, 5, 3], row 2 [8, 6, 2]
    rows = [[5, 4, 1], [6, 5, 3], [8, 6, 2]]
    expect2 = sum(-math.log(softmax(r)[0]) for r in rows) / 3
    assert adopt_direction(s, eye, 2, 0.1, 0.2).item() == pytest.approx(expect2, rel=1e-5)
    # the paper's printed form leaves the positive out: LSE(negatives) - positive/τ
    expect3 = sum(math.log(sum(math.exp(v) for v in r[1:])) - r[0] for r in rows) / 3
    assert adopt_direction(s, eye, 2, 0.1, 0.2, positive_in_denominator=False).item() == pytest.approx(expect3,
                                                                                                         rel=1e-5)


def test_zero_diagonal_mask_can_pick_the_positive_as_negative():
    s = torch.tensor([[0.5, -0.3, -0.5], [-0.2, 0.6, -0.4], [-0.6, -0.1, 0.7]], dtype=torch.float64)
    eye = torch.eye(3, dtype=torch.bool)
    # code: the masked diagonal (0) beats every negative, so the positive itself is "the hardest negative":
    # logits [S_ii, S_ii + 0.2] / 0.1 -> CE = log(1 + e^2) for every row
    code = adopt_direction(s, eye, 1, 0.1, 0.2, diag_mask="zero").item()
    assert code == pytest.approx(math.log(1 + math.exp(2)), rel=1e-5)
    # guarded: the true hardest negatives -0.3, -0.2, -0.1
    rows = [[5, -1], [6, 0], [7, 1]]
    guarded = adopt_direction(s, eye, 1, 0.1, 0.2, diag_mask="neg_inf").item()
    assert guarded == pytest.approx(sum(-math.log(softmax(r)[0]) for r in rows) / 3, rel=1e-5)


def test_adopt_loss_directions_and_sibling_positives():
    s = torch.tensor([[0.5, 0.2, -0.1], [0.3, 0.6, 0.1], [0.0, 0.4, 0.8]])
    out = adopt_loss(s, k_mode="constant", const_k=1, tau=0.1, neg_margin=0.2)
    i2t = (2 * math.log(1 + math.exp(-1)) + math.log(1 + math.exp(-2))) / 3
    # columns as queries: hardest negatives 0.3 (col 0), 0.4 (col 1), 0.1 (col 2) -> logits [5,5], [6,6], [8,3]
    t2i = (2 * math.log(2) + math.log(1 + math.exp(-5))) / 3
    assert out["loss"].item() == pytest.approx((i2t + t2i) / 2, rel=1e-5)
    summed = adopt_loss(s, k_mode="constant", const_k=1, tau=0.1, neg_margin=0.2, direction_reduce="sum")
    assert summed["loss"].item() == pytest.approx(i2t + t2i, rel=1e-5)
    # captions 0 and 1 of the same image: (0, 1) and (1, 0) are positives, not negatives
    pos = torch.tensor([[True, True, False], [True, True, False], [False, False, True]])
    sib = adopt_loss(s, pos, k_mode="constant", const_k=1, tau=0.1, neg_margin=0.2)
    rows = [[5, 1], [6, 3], [8, 6]]   # row 0 -> -0.1, row 1 -> 0.1, row 2 -> 0.4
    cols = [[5, 2], [6, 6], [8, 3]]   # col 0 -> 0.0, col 1 -> 0.4, col 2 -> 0.1
    ce = lambda rs: sum(-math.log(softmax(r)[0]) for r in rs) / 3  # noqa: E731
    assert sib["loss"].item() == pytest.approx((ce(rows) + ce(cols)) / 2, rel=1e-5)


def test_adaptive_k_is_logged_and_random_mode_in_range():
    sims = toy(16, 0.5, 0.1)
    out = adopt_loss(sims)
    assert out["k"].item() == adopt_num_negatives(sims, "code", 1.25)
    assert out["align"].item() == pytest.approx(0.5) and torch.isfinite(out["loss"])
    torch.manual_seed(0)
    ks = {int(adopt_loss(sims, k_mode="random")["k"]) for _ in range(50)}
    assert min(ks) >= 1 and max(ks) <= 15 and len(ks) > 5


def loss_only_model(*overrides):
    """A VSE2AD whose compute_loss sees the loss config of the synth recipe plus ``overrides`` (no weights)."""
    from pathlib import Path

    from xmr.run.config import load_run_config
    from xmr.methods.base import settings_from
    from xmr.methods.vse_2ad import VSE2AD

    cfg = load_run_config(Path(__file__).resolve().parents[1] / "config" / "recipes" / "synth" / "vse_2ad.yaml",
                          list(overrides))
    model = VSE2AD.__new__(VSE2AD)  # compute_loss reads only its loss settings
    torch.nn.Module.__init__(model)
    model.loss_settings = settings_from(VSE2AD.loss_settings_class, cfg["loss"], "loss")
    return model


def test_method_loss_passes_config_and_sibling_mask_to_adopt_and_triplet():
    s = torch.tensor([[0.5, 0.2, -0.1], [0.3, 0.6, 0.1], [0.0, 0.4, 0.8]])
    img, txt = torch.eye(3), s.t().contiguous()  # img @ txt.T == s
    pos = torch.tensor([[True, True, False], [True, True, False], [False, False, True]])
    ce = lambda rs: sum(-math.log(softmax(r)[0]) for r in rs) / 3  # noqa: E731
    model = loss_only_model("loss.k_mode=constant", "loss.const_k=1", "loss.tau=0.1", "loss.margin=0.2")
    out = model.compute_loss({"img": img, "txt": txt}, pos, 0.0)
    # as in test_adopt_loss_directions_and_sibling_positives: rows [5, 1], [6, 3], [8, 6]; cols [5, 2], [6, 6], [8, 3]
    assert out["loss"].item() == pytest.approx((ce([[5, 1], [6, 3], [8, 6]]) + ce([[5, 2], [6, 6], [8, 3]])) / 2,
                                               rel=1e-5)
    assert out["k"].item() == 1.0
    # paper options: summed directions, positive left out of the denominator
    paper = loss_only_model("loss.k_mode=constant", "loss.const_k=1", "loss.tau=0.1", "loss.margin=0.2",
                            "loss.direction_reduce=sum", "loss.positive_in_denominator=false")
    lse_minus_pos = lambda rs: sum(r[1] - r[0] for r in rs) / 3  # noqa: E731  (one negative: LSE = itself)
    assert paper.compute_loss({"img": img, "txt": txt}, pos, 0.0)["loss"].item() == pytest.approx(
        lse_minus_pos([[5, 1], [6, 3], [8, 6]]) + lse_minus_pos([[5, 2], [6, 6], [8, 3]]), rel=1e-5)
    # "-ADOPT": VSE++ triplet (sum reduction), summed hinges in the warm-up epoch, hardest negative after it.
    # margin 0.5, diagonal-only mask: rows r0: col 1 0.2 (col 2 < 0) | r1: col 0 0.2, col 2 0.0 | r2: col 1 0.1;
    # cols c0: row 1 0.3, row 2 0.0 | c1: row 0 0.1, row 2 0.3 | c2: none  => sum 1.2, hardest 1.1
    tri = loss_only_model("loss.name=triplet", "loss.margin=0.5", "loss.warmup_epochs=1")
    eye = torch.eye(3, dtype=torch.bool)
    assert tri.compute_loss({"img": img, "txt": txt}, eye, 0.5)["loss"].item() == pytest.approx(1.2, abs=1e-6)
    assert tri.compute_loss({"img": img, "txt": txt}, eye, 1.0)["loss"].item() == pytest.approx(1.1, abs=1e-6)
    # sibling mask: (0, 1) and (1, 0) are not negatives; left: r2 col 1 0.1 and c1 row 2 0.3
    assert tri.compute_loss({"img": img, "txt": txt}, pos, 0.5)["loss"].item() == pytest.approx(0.4, abs=1e-6)
    assert tri.compute_loss({"img": img, "txt": txt}, pos, 1.0)["loss"].item() == pytest.approx(0.4, abs=1e-6)
