"""CODER pieces against hand-computed values: diversity (Eqs. 7-8), DCL (Eq. 9), Sinkhorn codes, the concept
vocabulary and graph (Eqs. 4-5), momentum update, queue and same-image masking, checkpoint round trip."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from xmr.core.errors import XmrError
from xmr.losses.diversity_contrastive import dcl_direction, dcl_loss, diversity
from xmr.losses.pseudo_label import pseudo_label_loss, sinkhorn_codes
from xmr.methods.coder import concept_adjacency, cooccurrence, select_concepts

E = math.e

# two anchors; column 0 is each row's positive. Negatives: row 0 {0.1, 0.3} (mean 0.2, std 0.1),
# row 1 {0.0, 0.4} (mean 0.2, std 0.2)
S = torch.tensor([[0.9, 0.1, 0.3], [0.8, 0.0, 0.4]])
NEG = torch.tensor([[False, True, True], [False, True, True]])


def test_diversity_std_matches_eq7_and_the_cards_table():
    raw = [1 + math.exp(-1.0), 1 + math.exp(-0.5)]  # 1/sigmoid(z) = 1 + e^-z with z = eps/SD = 1 and 0.5
    assert raw[0] == pytest.approx(1.368, abs=1e-3) and raw[1] == pytest.approx(1.607, abs=1e-3)  # card §2.1
    assert diversity(S, NEG, "std", 0.1).tolist() == pytest.approx([raw[0] / raw[1], 1.0], rel=1e-5)
    inv = [1 / r for r in raw]
    assert diversity(S, NEG, "std", 0.1, direction="inverse").tolist() == pytest.approx(
        [1.0, inv[1] / inv[0]], rel=1e-5)
    # printed SD = sqrt(E[S] - E[S]^2) = sqrt(0.2 - 0.04) = 0.4 for both rows -> equal diversities
    assert diversity(S, NEG, "std", 0.1, sd_formula="printed").tolist() == pytest.approx([1.0, 1.0])
    assert diversity(S, NEG, "none").tolist() == [1.0, 1.0]


def test_diversity_entropy_matches_eq8():
    def ent(vals):
        p = [math.exp(v) / sum(math.exp(u) for u in vals) for v in vals]
        return -sum(q * math.log2(q) for q in p)

    raw = [1 / (1 / (1 + math.exp(-0.1 / ent(v)))) for v in ([0.1, 0.3], [0.0, 0.4])]
    assert diversity(S, NEG, "entropy", 0.1).tolist() == pytest.approx([r / max(raw) for r in raw], rel=1e-5)


def test_dcl_direction_literal_relative_infonce_by_hand():
    s = torch.tensor([[0.6, 0.3, 0.1]])
    pos, neg = torch.tensor([0]), torch.tensor([[False, True, True]])
    one, half = torch.tensor([1.0]), torch.tensor([0.5])
    # literal: mu * [log(1 + e^{(0.3-0.2)/0.1} + e^{(0.1-0.2)/0.1}) - log(1 + 0.6)]
    lit = 0.1 * (math.log(1 + E + 1 / E) - math.log(1.6))
    assert dcl_direction(s, pos, neg, one, 0.1, 0.2).item() == pytest.approx(lit, rel=1e-5)
    # div 0.5 halves the temperature: exponents (0.1)/0.05 = 2 and -2
    lit_half = 0.1 * (math.log(1 + E**2 + E**-2) - math.log(1.6))
    assert dcl_direction(s, pos, neg, half, 0.1, 0.2).item() == pytest.approx(lit_half, rel=1e-5)
    # relative: mu * log(1 + Σ e^{(S_nq - S_nn + γ)/μ}) = 0.1 log(1 + e^{-1} + e^{-3})
    rel = 0.1 * math.log(1 + E**-1 + E**-3)
    assert dcl_direction(s, pos, neg, one, 0.1, 0.2, "relative").item() == pytest.approx(rel, rel=1e-5)
    # infonce with τ = 0.1: -log(e^6 / (e^6 + e^3 + e^1))
    nce = -math.log(E**6 / (E**6 + E**3 + E))
    assert dcl_direction(s, pos, neg, one, 0.1, 0.2, "infonce").item() == pytest.approx(nce, rel=1e-5)
    with pytest.raises(XmrError):
        dcl_direction(s, pos, neg, one, 0.1, 0.2, "other")


def test_dcl_loss_sums_both_directions():
    v = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    w = torch.tensor([[0.8, 0.6], [0.6, 0.8]])  # S = [[0.8, 0.6], [0.6, 0.8]]
    neg = ~torch.eye(2, dtype=torch.bool)
    out = dcl_loss(v, w, w, v, neg, neg, mu=0.1, gamma=0.2)
    # one negative per anchor -> SD 0 -> div 1 everywhere; four identical anchor terms, two per direction
    per_anchor = 0.1 * (math.log(1 + math.exp(4)) - math.log(1.8))
    assert out["loss"].item() == pytest.approx(2 * per_anchor, rel=1e-5)


def test_sinkhorn_codes_balance_and_symmetric_case():
    codes = sinkhorn_codes(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), epsilon=0.5, iterations=3)
    a = E**2 / (E**2 + 1)  # exp(1/0.5) vs exp(0): already balanced, rows just normalise
    assert codes.tolist() == [pytest.approx([a, 1 - a], rel=1e-5), pytest.approx([1 - a, a], rel=1e-5)]
    # every sample prefers prototype 0: equipartition forces half of the mass onto prototype 1
    skew = sinkhorn_codes(torch.tensor([[1.0, 0.0], [1.0, 0.0]]), epsilon=0.5, iterations=1)
    assert skew.tolist() == [pytest.approx([0.5, 0.5]), pytest.approx([0.5, 0.5])]


def test_pseudo_label_loss_is_soft_cross_entropy():
    logits = torch.tensor([[0.0, math.log(3.0)]])  # softmax [0.25, 0.75]
    codes = torch.tensor([[0.5, 0.5]])
    assert pseudo_label_loss(logits, codes).item() == pytest.approx(-(0.5 * math.log(0.25) + 0.5 * math.log(0.75)))


CAPS = [["a", "dog", "runs", "on", "grass"], ["the", "dog", "and", "a", "cat"], ["cat", "on", "grass"],
        ["dog", "sleeps"]]


def test_concept_selection_frequency_stopwords_ties_and_types():
    # counts: dog 3, cat 2, grass 2, runs 1, sleeps 1; stop words a/on/the/and dropped; ties alphabetical
    assert select_concepts(CAPS, 4) == ["dog", "cat", "grass", "runs"]
    types = {"dog": "object", "cat": "object", "grass": "object", "runs": "motion", "sleeps": "motion"}
    # ratio 2:1:1 of 4 -> 2 objects, 1 motion, 1 property (none typed: filled by the next typed word)
    assert select_concepts(CAPS, 4, word_types=types, type_ratio=(2, 1, 1)) == ["dog", "cat", "grass", "runs"]
    assert select_concepts(CAPS, 3, word_types=types, type_ratio=(1, 2, 0)) == ["dog", "runs", "sleeps"]


def test_cooccurrence_and_literal_adjacency_by_hand():
    concepts = ["dog", "cat", "grass"]
    units = [{"dog", "grass"}, {"dog", "cat"}, {"cat", "grass"}, {"dog"}]
    counts, n = cooccurrence(units, concepts)
    assert n.tolist() == [3, 2, 2]
    assert counts.tolist() == [[0, 1, 1], [1, 0, 1], [1, 1, 0]]
    # P = B / N_i: dog row 1/3, cat and grass rows 1/2; threshold 0.4 keeps the cat and grass rows only
    adj = concept_adjacency(counts, n, eps=0.4, mode="coder_literal", rescale="none")
    # H = [[0,0,0],[1,0,1],[1,1,0]], row degrees D = (0, 2, 2): D^-1/2 H D^-1/2 + I (zero degree -> 0)
    h = np.array([[0, 0, 0], [1, 0, 1], [1, 1, 0]], dtype=float)
    dinv = np.array([0.0, 1 / math.sqrt(2), 1 / math.sqrt(2)])
    assert np.allclose(adj, dinv[:, None] * h * dinv[None, :] + np.eye(3))
    assert np.allclose(adj, [[1, 0, 0], [0, 1, 0.5], [0, 0.5, 1]])
    kipf = concept_adjacency(counts, n, eps=0.4, mode="kipf", rescale="none")
    d = np.array([1.0, 3.0, 3.0])  # degrees of H + I
    assert np.allclose(kipf, (h + np.eye(3)) / np.sqrt(d[:, None] * d[None, :]))
    # CVSE rescale: 5^(P - 0.02) - 5^-0.02 is 1.197 for P = 1/2 and 0.687 for P = 1/3
    resc = concept_adjacency(counts, n, eps=1.0, mode="coder_literal", rescale="cvse")
    assert np.allclose(resc, adj)  # 1/3 -> 0.58 < 1.0 dropped, 1/2 -> 1.12 kept: same graph


VOCAB = ["<pad>", "<unk>", "<start>", "<end>", "dog", "cat", "grass", "runs", "sleeps"]


def tiny_cfg(**loss) -> dict:
    return {"method": "coder", "model": {"embed_dim": 8, "residual_mlp": True,
                     "gpo": {"pe_dim": 4, "hidden_dim": 4, "mlp_layers": 1, "temperature": 0.1},
                     "size_augment": {"mode": "none", "p": 0.2}, "text_augment": 0.0,
                     "share_text_query_aggr": False,
                     "concept": {"enabled": True, "detach_query": False, "n_concepts": 6, "selection": "frequency", "type_ratio": [7, 2, 1],
                                 "word_types": None, "min_count": 1, "cooccurrence_unit": "caption",
                                 "word_vectors": None, "word_dim": 5, "trainable": True, "rescale": "cvse",
                                 "rescale_t": 5, "rescale_p": 0.02, "eps_graph": 0.3, "adj_mode": "coder_literal",
                                 "gcn_layers": 1, "smoothness": 10.0},
                     "momentum": 0.9, "queue_size": 6, "n_prototypes": 3, "fusion_alpha": 1.0},
           "loss": {"ranking": "dcl", "margin": 0.2, "warmup_epochs": 1, "mu": 0.1, "gamma": 0.2, "form": "literal", "diversity": "std", "eps_div": 0.1,
                    "sd_formula": "std", "div_direction": "formula", "entropy_temperature": 1.0,
                    "weight_instance": 1.0, "weight_memory": 1.0, "weight_concept": 1.0, "weight_pseudo_label": 1.0,
                    "queue_mask_same_image": True, "sinkhorn_epsilon": 0.05, "sinkhorn_iterations": 3,
                    "prototype_temperature": 0.1, "pl_cross_modal": False, **loss},
           "text": {"encoder": "bigru", "word_vectors": None, "word_dim": 6, "max_len": 16},
           "train": {"seed": 0}, "eval": {"similarity": "model", "alpha": 16.0, "rerank": {}}}


def tiny_model(**loss):
    from xmr.methods.coder import CODER

    torch.manual_seed(0)
    model = CODER.from_config(tiny_cfg(**loss), image_dim=7, vocab_words=VOCAB)
    model.build_concepts(CAPS, [0, 0, 1, 1])
    return model


def batch(model, feats, lengths=(3, 2, 3, 1)):
    text = model.text.collate([""] * 4, [["dog", "runs"], ["cat"], ["dog", "cat", "grass"], ["sleeps"]])
    return feats, torch.tensor(lengths), text


def test_concepts_are_built_stored_and_masked():
    model = tiny_model()
    assert model.concept_words == ["dog", "cat", "grass", "runs", "sleeps"]
    assert model.concept_valid.tolist() == [True] * 5 + [False]
    y = model.concept_vectors()
    assert torch.allclose(y[:5].norm(dim=1), torch.ones(5), atol=1e-5)
    # concept attention never uses the unfilled slot
    emb = model.encode_image(torch.randn(4, 3, 7), torch.tensor([3, 2, 3, 1]))
    assert emb.shape == (4, 2, 8)
    state = model.state_dict()
    from xmr.methods.coder import CODER

    torch.manual_seed(1)
    other = CODER.from_config(tiny_cfg(), 7, VOCAB)
    assert other.concept_words == [] and not bool(other.concepts_built)
    other.load_state_dict(state)
    assert other.concept_words == model.concept_words and bool(other.concepts_built)
    assert torch.equal(other.concept_adj, model.concept_adj)


def test_checkpoint_state_loads_with_weights_only(tmp_path):
    model = tiny_model()
    torch.save({"model": model.state_dict()}, tmp_path / "ck.pt")
    ck = torch.load(tmp_path / "ck.pt", weights_only=True)
    assert ck["model"]["_extra_state"]["concept_words"] == model.concept_words


def test_momentum_update_queue_and_same_image_masking():
    model = tiny_model()
    model.train()
    torch.manual_seed(3)
    feats = torch.randn(1, 3, 7).expand(4, 3, 7).contiguous()  # four captions of one image
    five = torch.tensor([5, 5, 5, 5])  # dataset image 5
    online0 = model.query_image.weight.clone()
    key_before = model.key_image_proj.fc.weight.clone()
    out = model(*batch(model, feats, (3, 3, 3, 3)), five)
    key_img, key_txt, image_index = out["key_img"], out["key_txt"], out["image_index"]
    assert image_index.tolist() == [5, 5, 5, 5]
    pos = torch.ones(4, 4, dtype=torch.bool)
    terms = model.compute_loss(out, pos, 0.0)
    assert all(torch.isfinite(v) for v in terms.values())
    # empty queue: the memory loss sees only the batch keys
    with torch.no_grad():
        model.image_proj.fc.weight.add_(1.0)  # pretend an optimizer step
    model.on_train_step_end(out)
    expect = 0.9 * key_before + 0.1 * model.image_proj.fc.weight
    assert torch.allclose(model.key_image_proj.fc.weight, expect, atol=1e-6)
    assert torch.equal(model.query_image.weight, online0)
    assert int(model.queue_ptr) == 4
    assert torch.equal(model.queue_img[:4], key_img) and torch.equal(model.queue_txt[:4], key_txt)
    assert model.queue_image.tolist() == [5, 5, 5, 5, -1, -1]  # slots 4, 5 still empty
    # the same image again: every queued entry belongs to the anchor's own image -> masked, so the memory term
    # equals the one computed with an empty queue
    out = model(*batch(model, feats, (3, 3, 3, 3)), five)
    with_queue = model.compute_loss(out, pos, 1.0)["memory"]
    model.queue_image.fill_(-1)
    empty = model.compute_loss(out, pos, 1.0)["memory"]
    assert with_queue.item() == pytest.approx(empty.item(), rel=1e-6)
    # different images in the queue do count as negatives: with div = 1, extra negatives raise the loss
    model.loss_settings = dataclasses.replace(model.loss_settings, diversity="none")
    empty = model.compute_loss(out, pos, 1.0)["memory"]
    model.queue_image[:4] = 6  # the same four keys, now of another image
    other = model.compute_loss(out, pos, 1.0)["memory"]
    assert other.item() > empty.item()


def test_fusion_similarity_mixes_instance_and_concept_scores():
    model = tiny_model()
    img = torch.nn.functional.normalize(torch.randn(3, 2, 8), dim=-1)
    txt = torch.nn.functional.normalize(torch.randn(5, 2, 8), dim=-1)
    assert torch.allclose(model.similarity_matrix(img, txt), img[:, 0] @ txt[:, 0].t(), atol=1e-6)
    model.model_settings = dataclasses.replace(model.model_settings, fusion_alpha=0.25)
    expect = 0.25 * img[:, 0] @ txt[:, 0].t() + 0.75 * img[:, 1] @ txt[:, 1].t()
    assert torch.allclose(model.similarity_matrix(img, txt), expect, atol=1e-6)


# -- the total loss, recomputed with naive loops from the card's formulas ----------------------------------------

def naive_dcl_direction(s, neg, mu, gamma, eps):
    """Eq. 9 with Eq. 7 (true std over the negatives, div = 1/sigmoid(eps/SD) divided by the batch max):
    mean over anchors n of mu [log(1 + Σ_neg e^{(S_nq - γ)/(μ div_n)}) - log(S_nn + 1)]; positive = column n."""
    raw = []
    for n in range(len(s)):
        v = [s[n, q] for q in range(s.shape[1]) if neg[n, q]]
        mean = sum(v) / len(v)
        sd = math.sqrt(sum((x - mean) ** 2 for x in v) / len(v))
        raw.append(1 + math.exp(-eps / sd))
    div = [r / max(raw) for r in raw]
    terms = [mu * (math.log(1 + sum(math.exp((s[n, q] - gamma) / (mu * div[n])) for q in range(s.shape[1])
                                    if neg[n, q])) - math.log(s[n, n] + 1)) for n in range(len(s))]
    return sum(terms) / len(terms)


def naive_sinkhorn(scores, eps, iterations):
    """SwAV codes: Q = exp(scores/ε)ᵀ, alternately rows (prototypes) to 1/P and columns (samples) to 1/B."""
    q = np.exp(scores / eps).T
    q /= q.sum()
    p, b = q.shape
    for _ in range(iterations):
        q /= q.sum(1, keepdims=True) * p
        q /= q.sum(0, keepdims=True) * b
    return (q * b).T


def soft_ce(logits, codes):
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    return float(-(codes * logp).sum(1).mean())


def test_total_loss_weights_terms_computed_from_the_formulas():
    model = tiny_model(weight_instance=0.5, weight_memory=2.0, weight_concept=3.0, weight_pseudo_label=0.25)
    model.train()
    torch.manual_seed(4)
    feats = torch.randn(4, 3, 7)
    feats[1] = feats[0]  # captions 0 and 1 describe the same image
    pos = torch.eye(4, dtype=torch.bool)
    pos[0, 1] = pos[1, 0] = True
    with torch.no_grad():  # an optimizer step moved the online encoders away from their momentum copies
        model.image_proj.fc.weight.mul_(1.5)
        model.text_gpo.score.weight.add_(0.3)
    fwd = model(*batch(model, feats, (3, 3, 2, 3)), torch.tensor([0, 0, 1, 2]))
    img, txt = fwd["img"], fwd["txt"]
    key_img, key_txt = (fwd[k].detach().double().numpy() for k in ("key_img", "key_txt"))
    out = model.compute_loss(fwd, pos, 0.0)
    vi, vc = img[:, 0].detach().double().numpy(), img[:, 1].detach().double().numpy()
    wi, wc = txt[:, 0].detach().double().numpy(), txt[:, 1].detach().double().numpy()
    neg = ~pos.numpy()
    both = lambda a, b, ka, kb: (naive_dcl_direction(a @ kb.T, neg, 0.1, 0.2, 0.1)  # noqa: E731
                                 + naive_dcl_direction(b @ ka.T, neg.T, 0.1, 0.2, 0.1))
    instance = both(vi, wi, vi, wi)
    memory = both(vi, wi, key_img, key_txt)  # empty queue: the candidates are the batch's momentum keys
    concept = both(vc, wc, vc, wc)
    protos = model.prototypes.weight.detach().double().numpy()
    protos = protos / np.linalg.norm(protos, axis=1, keepdims=True)
    pseudo = (soft_ce(vc @ protos.T / 0.1, naive_sinkhorn(key_img @ protos.T, 0.05, 3))
              + soft_ce(wc @ protos.T / 0.1, naive_sinkhorn(key_txt @ protos.T, 0.05, 3)))
    assert out["instance"].item() == pytest.approx(instance, rel=1e-5)
    assert out["memory"].item() == pytest.approx(memory, rel=1e-5)
    assert out["concept"].item() == pytest.approx(concept, rel=1e-5)
    assert out["pseudo_label"].item() == pytest.approx(pseudo, rel=1e-4)
    assert out["loss"].item() == pytest.approx(0.5 * instance + 2 * memory + 3 * concept + 0.25 * pseudo, rel=1e-5)
    assert abs(memory - instance) > 1e-3  # the momentum keys are not the online embeddings here


def test_queue_wraps_around_fifo():
    model = tiny_model()  # queue_size 6, batches of 4
    model.train()
    pushed = []
    for step in range(2):
        torch.manual_seed(10 + step)
        images = torch.arange(4) + 10 * (step + 1)  # images 10-13, then 20-23
        out = model(*batch(model, torch.randn(4, 3, 7)), images)
        pushed.append(tuple(out[k].clone() for k in ("key_img", "key_txt", "image_index")))
        model.on_train_step_end(out)
    (img1, txt1, _), (img2, txt2, _) = pushed
    # step 1 fills slots 0-3; step 2 writes slots 4, 5, then wraps to 0, 1; the pointer ends at 2
    assert int(model.queue_ptr) == 2
    assert torch.equal(model.queue_img, torch.cat([img2[2:], img1[2:], img2[:2]]))
    assert torch.equal(model.queue_txt, torch.cat([txt2[2:], txt1[2:], txt2[:2]]))
    assert model.queue_image.tolist() == [22, 23, 12, 13, 20, 21]


def test_same_image_index_with_different_features_is_masked_in_the_memory_term():
    # end to end, every view of an image is a new random crop: its local features differ each time, only the
    # dataset index says it is the same image
    model = tiny_model()
    model.train()
    torch.manual_seed(5)
    first, second = torch.randn(4, 3, 7), torch.randn(4, 3, 7)
    model.on_train_step_end(model(*batch(model, first, (3, 3, 3, 3)), torch.tensor([0, 1, 2, 3])))
    assert model.queue_image.tolist() == [0, 1, 2, 3, -1, -1]  # queue slots 0-3: images 0, 1, 2, 3
    # image 0 again, as a different crop
    fwd = model(*batch(model, second, (3, 3, 3, 3)), torch.tensor([0, 7, 8, 9]))
    img, txt = fwd["img"], fwd["txt"]
    key_img, key_txt = (fwd[k].detach().double().numpy() for k in ("key_img", "key_txt"))
    pos = torch.eye(4, dtype=torch.bool)
    out = model.compute_loss(fwd, pos, 0.0)
    vi, wi = img[:, 0].detach().double().numpy(), txt[:, 0].detach().double().numpy()
    cand_txt = np.concatenate([key_txt, model.queue_txt.double().numpy()])
    cand_img = np.concatenate([key_img, model.queue_img.double().numpy()])
    # candidates: the 4 batch keys (negatives off the diagonal), then the 6 queue slots: slots 0-3 are
    # negatives, except slot 0 (image 0) for anchor 0; slots 4, 5 are empty
    batch_neg = ~np.eye(4, dtype=bool)
    queue_neg = np.array([[False, True, True, True, False, False]] + [[True, True, True, True, False, False]] * 3)
    unmasked = queue_neg.copy()
    unmasked[0, 0] = True
    memory = (naive_dcl_direction(vi @ cand_txt.T, np.concatenate([batch_neg, queue_neg], 1), 0.1, 0.2, 0.1)
              + naive_dcl_direction(wi @ cand_img.T, np.concatenate([batch_neg, queue_neg], 1), 0.1, 0.2, 0.1))
    as_negative = (naive_dcl_direction(vi @ cand_txt.T, np.concatenate([batch_neg, unmasked], 1), 0.1, 0.2, 0.1)
                   + naive_dcl_direction(wi @ cand_img.T, np.concatenate([batch_neg, unmasked], 1), 0.1, 0.2, 0.1))
    assert out["memory"].item() == pytest.approx(memory, rel=1e-5)
    # a feature fingerprint would have seen a new image and kept slot 0 as anchor 0's negative
    assert not torch.equal(first[0, 0], second[0, 0])
    assert abs(memory - as_negative) > 1e-3
    model.loss_settings = dataclasses.replace(model.loss_settings, queue_mask_same_image=False)
    assert model.compute_loss(fwd, pos, 0.0)["memory"].item() == pytest.approx(as_negative, rel=1e-5)


def test_training_forward_needs_the_batch_image_indices():
    model = tiny_model()
    model.train()
    feats = torch.randn(4, 3, 7)
    with pytest.raises(XmrError, match=r"model\(feats, num_regions, text, image_index\)"):
        model(*batch(model, feats))
    with pytest.raises(XmrError, match=r"\(4,\) integer tensor"):
        model(*batch(model, feats), torch.tensor([0, 1, 2]))  # indices of another batch size
    model.eval()
    out = model(*batch(model, feats))  # evaluation needs none
    img, txt = out["img"], out["txt"]
    assert img.shape == (4, 2, 8) and txt.shape == (4, 2, 8)


def test_old_fingerprint_checkpoint_loads_with_an_empty_queue():
    model = tiny_model()
    model.train()
    model.on_train_step_end(model(*batch(model, torch.randn(4, 3, 7)), torch.tensor([0, 1, 2, 3])))
    old = model.state_dict()
    del old["queue_image"]  # a checkpoint written by the fingerprint version
    old["queue_fingerprint"] = torch.tensor([0.5, -1.25, 2.0, 3.5] + [float("nan")] * 2, dtype=torch.float64)
    from xmr.methods.coder import CODER

    fresh = CODER.from_config(tiny_cfg(), 7, VOCAB)
    with pytest.warns(UserWarning, match="queue_fingerprint"):
        fresh.load_state_dict(old)  # strict
    assert fresh.queue_image.tolist() == [-1] * 6 and int(fresh.queue_ptr) == 0
    assert not fresh.queue_img.any() and not fresh.queue_txt.any()
    assert torch.equal(fresh.key_image_proj.fc.weight, model.key_image_proj.fc.weight)
    assert torch.equal(fresh.image_proj.fc.weight, model.image_proj.fc.weight)
    assert fresh.concept_words == model.concept_words
