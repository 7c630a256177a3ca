"""GPO (VSE∞) pieces against hand-computed values: rank encoding, per-dimension sort, pooling, warm-up loss,
size/caption augmentation."""

import math

import pytest
import torch

from xmr.models.augment import augment_token_ids, compact, drop_regions
from xmr.models.gpo import GPO, sinusoidal_encoding, sort_per_dimension
from xmr.models.pooling import mean_pool


def test_sinusoidal_encoding_matches_formula():
    pe = sinusoidal_encoding(3, 4)  # u_0 = 1, u_1 = 10000^(-2/4) = 0.01
    for k in range(3):
        assert pe[k].tolist() == pytest.approx([math.sin(k), math.cos(k), math.sin(0.01 * k), math.cos(0.01 * k)],
                                               abs=1e-6)


def test_sort_per_dimension_sorts_each_dimension_and_zeroes_padding():
    x = torch.tensor([[[1.0, 5.0], [3.0, 2.0], [2.0, 4.0]],
                      [[-1.0, -2.0], [-3.0, 7.0], [99.0, 99.0]]])  # second sample: 2 valid, last row padding
    s, valid = sort_per_dimension(x, torch.tensor([3, 2]))
    assert s[0].tolist() == [[3.0, 5.0], [2.0, 4.0], [1.0, 2.0]]
    assert s[1].tolist() == [[-1.0, 7.0], [-3.0, -2.0], [0.0, 0.0]]
    assert valid[:, :, 0].tolist() == [[True, True, True], [True, True, False]]


def test_gpo_weighted_sum_of_sorted_features(monkeypatch):
    gpo = GPO(pe_dim=4, hidden_dim=3)
    theta = torch.tensor([[[0.5], [0.3], [0.2]]])
    monkeypatch.setattr(gpo, "pool_weights", lambda lengths, max_len=None: theta)
    x = torch.tensor([[[1.0, 5.0], [3.0, 2.0], [2.0, 4.0]]])
    # dim 0 sorted 3,2,1 -> 1.5+0.6+0.2; dim 1 sorted 5,4,2 -> 2.5+1.2+0.4
    assert gpo(x, torch.tensor([3]))[0].tolist() == pytest.approx([2.3, 4.1])


def test_gpo_weights_equal_a_per_sample_reference():
    torch.manual_seed(0)
    gpo = GPO(pe_dim=8, hidden_dim=5)
    lengths = torch.tensor([4, 2, 4, 1])
    w = gpo.pool_weights(lengths)[..., 0]
    for i, n in enumerate(lengths.tolist()):
        # naive: the GRU over this sample's own n rank encodings, no packing, no batching over lengths
        h, _ = gpo.gru(sinusoidal_encoding(n, 8)[None])
        h = (h[..., :5] + h[..., 5:]) / 2
        ref = torch.softmax(gpo.score(h)[0, :, 0] / 0.1, dim=0)
        assert w[i, :n].tolist() == pytest.approx(ref.tolist(), abs=1e-6)
        assert w[i, n:].abs().sum() == 0


@pytest.mark.parametrize("mlp_layers", [1, 2])
def test_gpo_device_path_equals_the_host_path(mlp_layers):
    """The accelerator path (no host read of the lengths: every size up to the padded width, sorted over the
    whole width) gives the weights and pooled vectors of the per-distinct-size path; forced here on the CPU."""
    torch.manual_seed(0)
    gpo = GPO(pe_dim=8, hidden_dim=5, mlp_layers=mlp_layers)
    x, lengths = torch.randn(6, 7, 3), torch.tensor([4, 2, 4, 1, 5, 2])  # width 7 > every length
    host = gpo.pool_weights(lengths)  # (6, 5, 1): trimmed to the longest set
    device = gpo.pool_weights(lengths, max_len=7)
    assert device.shape == (6, 7, 1) and device[:, 5:].abs().sum() == 0
    assert torch.allclose(device[:, :5], host, atol=1e-6)
    gpo.host_free = False
    pooled_host = gpo(x, lengths)
    gpo.host_free = True
    x_grad = x.clone().requires_grad_()
    pooled_device = gpo(x_grad, lengths)
    assert torch.allclose(pooled_device, pooled_host, atol=1e-6)
    pooled_device.sum().backward()  # the padding gets no gradient
    for i, n in enumerate(lengths.tolist()):
        assert x_grad.grad[i, n:].abs().sum() == 0


def test_gpo_with_flat_scores_is_mean_pooling_and_permutation_invariant():
    torch.manual_seed(0)
    gpo = GPO(pe_dim=4, hidden_dim=3)
    torch.nn.init.zeros_(gpo.score.weight)  # equal scores -> uniform weights over the valid positions
    x, lengths = torch.randn(3, 5, 6), torch.tensor([5, 3, 1])
    assert torch.allclose(gpo(x, lengths), mean_pool(x, lengths), atol=1e-6)
    torch.manual_seed(1)
    gpo2 = GPO(pe_dim=4, hidden_dim=3, mlp_layers=2)
    perm = torch.tensor([2, 0, 1, 3, 4])  # shuffles the 3 valid elements of sample 1 only
    x2 = x.clone()
    x2[1] = x[1, perm]
    assert torch.allclose(gpo2(x, lengths), gpo2(x2, lengths), atol=1e-6)


def test_vse_inf_loss_switches_from_summed_hinges_to_hardest_after_warmup():
    from xmr.methods.vse_inf import VSEInfinity, VSEInfinityLoss

    sims = torch.tensor([[0.5, 0.6, 0.1], [0.2, 0.4, 0.3], [0.0, 0.5, 0.7]])
    model = VSEInfinity.__new__(VSEInfinity)  # compute_loss reads only its loss settings
    torch.nn.Module.__init__(model)
    model.loss_settings = VSEInfinityLoss(margin=0.2, warmup_epochs=1, reduction="sum")
    eye = torch.eye(3, dtype=torch.bool)
    img, txt = torch.eye(3), sims.t().contiguous()  # img @ txt.T == sims
    # image anchors: row hinges 0.3 (row 0) + 0.1 (row 1); caption anchors: col 1 hinges 0.4 + 0.3
    assert model.compute_loss({"img": img, "txt": txt}, eye, 0.5)["loss"].item() == pytest.approx(1.1)
    # hardest: rows 0.3 + 0.1 + 0, columns 0 + 0.4 + 0
    assert model.compute_loss({"img": img, "txt": txt}, eye, 1.0)["loss"].item() == pytest.approx(0.8)


def test_compact_moves_kept_entries_first_in_order():
    x = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    keep = torch.tensor([[False, True, False, True], [True, False, False, False]])
    out, n = compact(x, keep, pad_value=0)
    assert out.tolist() == [[2, 4], [5, 0]] and n.tolist() == [2, 1]


def test_drop_regions_keeps_valid_regions_in_order_and_at_least_one():
    torch.manual_seed(0)
    b, r = 64, 6
    feats = torch.arange(b * r, dtype=torch.float32).reshape(b, r, 1) + 1  # all distinct, nonzero
    lengths = torch.randint(1, r + 1, (b,))
    out, n = drop_regions(feats, lengths, "region", 0.5)
    assert (n >= 1).all() and (n <= lengths).all() and n.float().mean() < lengths.float().mean()
    for i in range(b):
        kept = out[i, : n[i], 0]
        assert (torch.diff(kept) > 0).all()  # original order
        assert set(kept.tolist()) <= set(feats[i, : lengths[i], 0].tolist())
        assert (out[i, n[i]:] == 0).all()
    same, n_same = drop_regions(feats, lengths, "none", 0.5)
    assert same is feats and n_same is lengths


def test_augment_token_ids_rates_and_boundaries():
    torch.manual_seed(0)
    b, t = 200, 12
    ids = torch.arange(10, 10 + t).repeat(b, 1)  # <start>=10 ... <end>=21, inner 11..20
    lengths = torch.full((b,), t)
    out, n = augment_token_ids(ids, lengths, p=1.0, mask_id=99, random_low=50, random_high=60)
    masked = randomised = 0
    for i in range(b):
        row = out[i, : n[i]].tolist()
        assert row[0] == 10 and row[-1] == 21
        originals = [v for v in row[1:-1] if 11 <= v <= 20]
        assert originals == sorted(originals)
        masked += sum(v == 99 for v in row)
        randomised += sum(50 <= v < 60 for v in row)
    inner = b * (t - 2)
    deleted = inner - int((n - 2).sum())
    # with p = 1 every inner token is hit: 50% masked, 10% random, 40% deleted
    assert masked / inner == pytest.approx(0.5, abs=0.05)
    assert randomised / inner == pytest.approx(0.1, abs=0.03)
    assert deleted / inner == pytest.approx(0.4, abs=0.05)
    same, n_same = augment_token_ids(ids, lengths, p=0.0, mask_id=99, random_low=50, random_high=60)
    assert torch.equal(same, ids) and torch.equal(n_same, lengths)


def test_augment_caption_batch_bert_ids_keep_mask_and_lengths_consistent():
    from transformers import AutoTokenizer

    from xmr.models.augment import augment_caption_batch
    from xmr.models.text import resolve_bert_path

    tok = AutoTokenizer.from_pretrained(resolve_bert_path("minilm"))
    caps = ["a red square left of a blue circle", "two shapes"]
    enc = tok(caps, padding=True, return_tensors="pt")
    batch = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
             "lengths": enc["attention_mask"].sum(1)}
    torch.manual_seed(0)

    class Enc:
        tokenizer = tok

    out = augment_caption_batch(batch, Enc(), 1.0)
    for i in range(2):
        n = int(out["lengths"][i])
        row = out["input_ids"][i, :n].tolist()
        assert row[0] == tok.cls_token_id and row[-1] == tok.sep_token_id
        assert out["attention_mask"][i].tolist() == [1] * n + [0] * (out["input_ids"].shape[1] - n)
