"""HGLMM Fisher-vector text features: FV against hand-worked gradients, EM's Gaussian/Laplacian choice,
ICA/PCA shapes, fit -> save -> reload -> identical transform, word-vector readers, settings."""

import math
import struct

import numpy as np
import pytest

from xmr.core.errors import XmrError
from xmr.text.hglmm import (HGLMMModel, default_settings, fit_hglmm, load_text_feature_settings, read_vectors,
                            transform_captions)
from xmr.text.hybrid_mixture import HybridMixture

# -- a 1-D, 2-component mixture: component 0 Gaussian N(0, 1), component 1 Laplacian(m=2, s=0.5) -------------
W0, W1 = 0.6, 0.4
MU, VAR, M, S = 0.0, 1.0, 2.0, 0.5


def tiny_mixture(mu=MU, var=VAR, m=M, s=S) -> HybridMixture:
    # both components get both parameter sets; `gaussian` picks which one is used per (k, d)
    return HybridMixture(weights=np.array([W0, W1]), mean=np.array([[mu], [0.0]]), var=np.array([[var], [1.0]]),
                         loc=np.array([[0.0], [m]]), scale=np.array([[1.0], [s]]),
                         gaussian=np.array([[True], [False]]))


def gauss_pdf(x, mu, var):
    return math.exp(-(x - mu) ** 2 / (2 * var)) / math.sqrt(2 * math.pi * var)


def lap_pdf(x, m, s):
    return math.exp(-abs(x - m) / s) / (2 * s)


def mean_loglik(xs, mu=MU, var=VAR, m=M, s=S):
    return sum(math.log(W0 * gauss_pdf(x, mu, var) + W1 * lap_pdf(x, m, s)) for x in xs) / len(xs)


def test_fisher_vector_equals_hand_computed_gradients():
    words = [0.5, 1.5, 3.0]  # caption 0; caption 1 = [-1.0]; caption 2 has no word
    x = np.array([[0.5], [1.5], [3.0], [-1.0]])
    fv = tiny_mixture().fisher_vectors(x, np.array([0, 0, 0, 1]), 3, norm="none").numpy()
    assert fv.shape == (3, 4)  # [G_loc(k0), G_loc(k1), G_scale(k0), G_scale(k1)]

    # (a) the card's formulas written out with plain floats
    n = len(words)
    gam = [(W0 * gauss_pdf(v, MU, VAR), W1 * lap_pdf(v, M, S)) for v in words]
    gam = [(a / (a + b), b / (a + b)) for a, b in gam]
    sigma = math.sqrt(VAR)
    expect = [
        sum(g0 * (v - MU) / sigma for (g0, _), v in zip(gam, words)) / (n * math.sqrt(W0)),
        sum(g1 * math.copysign(1, v - M) for (_, g1), v in zip(gam, words)) / (n * math.sqrt(W1)),
        sum(g0 * ((v - MU) ** 2 / VAR - 1) for (g0, _), v in zip(gam, words)) / (n * math.sqrt(2 * W0)),
        sum(g1 * (abs(v - M) / S - 1) for (_, g1), v in zip(gam, words)) / (n * math.sqrt(W1)),
    ]
    np.testing.assert_allclose(fv[0], expect, rtol=1e-10)

    # (b) the same numbers as finite-difference gradients of the mean log-likelihood times the diagonal
    # Fisher normalisers (Gaussian mu: sigma/sqrt(w), sigma: sigma/sqrt(2w); Laplacian m, s: s/sqrt(w))
    h = 1e-6

    def grad(**kw):
        (key, val), = kw.items()
        return (mean_loglik(words, **{key: val + h}) - mean_loglik(words, **{key: val - h})) / (2 * h)

    d_sigma = (mean_loglik(words, var=(sigma + h) ** 2) - mean_loglik(words, var=(sigma - h) ** 2)) / (2 * h)
    fd = [grad(mu=MU) * sigma / math.sqrt(W0), grad(m=M) * S / math.sqrt(W1),
          d_sigma * sigma / math.sqrt(2 * W0), grad(s=S) * S / math.sqrt(W1)]
    np.testing.assert_allclose(fv[0], fd, rtol=1e-6)

    # a single word at the Gaussian mean: gamma0 = 0.6 N(0) / (0.6 N(0) + 0.4 Lap(0; 2, .5)); loc term 0,
    # Gaussian scale term -gamma0/sqrt(1.2), Laplacian sign term -gamma1/sqrt(.4), scale term gamma1 (4-1)/sqrt(.4)
    g0 = 0.6 / math.sqrt(2 * math.pi)
    g1 = 0.4 * math.exp(-4) / 1.0
    g0, g1 = g0 / (g0 + g1), g1 / (g0 + g1)
    one = tiny_mixture().fisher_vectors(np.array([[0.0]]), np.array([0]), 1, norm="none").numpy()[0]
    np.testing.assert_allclose(one, [0.0, -g1 / math.sqrt(0.4), -g0 / math.sqrt(1.2), 3 * g1 / math.sqrt(0.4)],
                               rtol=1e-10, atol=1e-15)

    np.testing.assert_array_equal(fv[2], 0.0)  # no word -> zero vector (card A23)
    # power + L2: signed square root, then unit length
    fv_n = tiny_mixture().fisher_vectors(x, np.array([0, 0, 0, 1]), 3, norm="power_l2").numpy()
    p = np.sign(fv[:2]) * np.sqrt(np.abs(fv[:2]))
    np.testing.assert_allclose(fv_n[:2], p / np.linalg.norm(p, axis=1, keepdims=True), rtol=1e-10)
    np.testing.assert_array_equal(fv_n[2], 0.0)


def test_log_joint_matches_elementwise_density():
    rng = np.random.default_rng(0)
    K, D = 3, 5
    mix = HybridMixture(rng.dirichlet(np.ones(K)), rng.normal(size=(K, D)), rng.uniform(0.5, 2, (K, D)),
                        rng.normal(size=(K, D)), rng.uniform(0.5, 2, (K, D)), rng.random((K, D)) < 0.5)
    x = rng.normal(size=(7, D))
    expect = np.zeros((7, K))
    for i in range(7):
        for k in range(K):
            lp = math.log(mix.weights[k])
            for d in range(D):
                if mix.gaussian[k, d]:
                    lp += math.log(gauss_pdf(x[i, d], mix.mean[k, d], mix.var[k, d]))
                else:
                    lp += math.log(lap_pdf(x[i, d], mix.loc[k, d], mix.scale[k, d]))
            expect[i, k] = lp
    np.testing.assert_allclose(mix.log_joint(x).numpy(), expect, rtol=1e-12)


def test_em_picks_gaussian_or_laplacian_per_dimension():
    rng = np.random.default_rng(1)
    n = 3000
    x = np.stack([rng.normal(1.0, 2.0, n), rng.laplace(-1.0, 0.7, n)], axis=1)
    mix, info = HybridMixture.fit(x, components=1, iterations=3, seed=0)
    # closed-form rule: Gaussian iff sigma / s <= sqrt(2e/pi); Gaussian data give sqrt(pi/2), Laplacian sqrt(2)
    assert mix.gaussian.tolist() == [[True, False]]
    np.testing.assert_allclose(mix.mean[0, 0], x[:, 0].mean(), rtol=1e-10)
    np.testing.assert_allclose(mix.var[0, 0], x[:, 0].var(), rtol=1e-10)
    med = np.sort(x[:, 1])[(n - 1) // 2]  # weighted median with equal weights: the lower median
    np.testing.assert_allclose(mix.loc[0, 1], med, rtol=1e-12)
    np.testing.assert_allclose(mix.scale[0, 1], np.abs(x[:, 1] - med).mean(), rtol=1e-10)
    assert mix.weights.tolist() == [1.0]

    # two well-separated clusters: EM recovers the weights and centres
    a = rng.normal(-5, 1, (900, 2))
    b = rng.normal(5, 1, (300, 2))
    mix2, info2 = HybridMixture.fit(np.concatenate([a, b]), components=2, iterations=20, seed=0)
    k_b = int(np.argmax(mix2.mean[:, 0]))
    np.testing.assert_allclose(mix2.weights[k_b], 0.25, atol=1e-3)
    np.testing.assert_allclose(mix2.mean[k_b], b.mean(0), atol=1e-3)
    assert info2["em_iterations"] <= 20


# -- word vectors and the whole pipeline -----------------------------------------------------------------

def write_vectors(tmp_path, words, vecs):
    txt = tmp_path / "vectors.txt"
    txt.write_text(f"{len(words)} {vecs.shape[1]}\n" + "".join(
        w + " " + " ".join(str(v) for v in row) + "\n" for w, row in zip(words, vecs)))  # float32 round trip
    binary = tmp_path / "vectors.bin"
    with open(binary, "wb") as f:
        f.write(f"{len(words)} {vecs.shape[1]}\n".encode())
        for w, row in zip(words, vecs):
            f.write(w.encode() + b" " + struct.pack(f"<{len(row)}f", *row) + b"\n")
    return txt, binary


@pytest.fixture
def toy_corpus(tmp_path):
    rng = np.random.default_rng(3)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = [a + b + "x" for a in letters for b in letters][:400]  # 'aax', 'abx', ...
    vecs = rng.laplace(size=(400, 8)).astype(np.float32)
    txt, binary = write_vectors(tmp_path, words, vecs)
    captions = [" ".join(rng.choice(words[:120], size=rng.integers(3, 8))) + "." for _ in range(150)]
    return words, vecs, txt, binary, captions


def test_word2vec_binary_and_text_readers_agree(toy_corpus):
    words, vecs, txt, binary, _ = toy_corpus
    want = {words[300], words[5], "missing"}
    i_t, m_t, h_t = read_vectors(str(txt), head=10, wanted=want)
    i_b, m_b, h_b = read_vectors(str(binary), head=10, wanted=want)
    assert h_t == h_b == words[:10]
    assert set(i_t) == set(i_b) == set(words[:10]) | {words[300]}
    for w in i_t:
        np.testing.assert_array_equal(m_t[i_t[w]], vecs[words.index(w)])
        np.testing.assert_array_equal(m_b[i_b[w]], m_t[i_t[w]])


def test_fit_shapes_pca_save_reload_transform(toy_corpus, tmp_path):
    words, vecs, txt, binary, captions = toy_corpus
    s = default_settings() | {"word_vectors": str(binary), "vocab_limit": 400, "fit_samples": 300, "components": 3,
                              "pca_dim": 10, "em_iterations": 5, "ica_max_iter": 200}
    model = fit_hglmm(s, captions, device="cpu", progress=False)
    D, K = 8, 3
    assert model.ica_matrix.shape == (D, D) and model.ica_mean.shape == (D,)
    assert model.mixture.mean.shape == (K, D) and model.mixture.fv_dim == 2 * K * D
    assert model.pca_components.shape == (10, 2 * K * D) and model.out_dim == 10
    # the ICA output of the fitting sample has unit variance per component (whiten="unit-variance")
    sample_words = np.stack([vecs[words.index(w)] for w in words if w.isalpha()])
    z = model.word_space(sample_words)
    np.testing.assert_allclose(z.std(0), 1.0, atol=0.15)

    feats, stats = transform_captions(model, captions + ["1234 !!"], device="cpu")
    assert feats.shape == (151, 10) and stats.empty_captions == 1 and stats.oov_tokens == 0
    # PCA = top eigenvectors of the training FVs' covariance: projections are centred and decorrelated,
    # with variances equal to the stored eigenvalues (descending)
    train = feats[:150].astype(np.float64)
    np.testing.assert_allclose(train.mean(0), 0.0, atol=1e-5)
    cov = np.cov(train, rowvar=False, bias=True)
    np.testing.assert_allclose(cov, np.diag(model.pca_eigenvalues), atol=1e-5)
    assert np.all(np.diff(model.pca_eigenvalues) <= 0)
    # a caption without in-vocabulary words has a zero FV, i.e. the projection of -mean (card A23)
    np.testing.assert_allclose(feats[150], -model.pca_mean @ model.pca_components.T.astype(np.float64), atol=1e-5)

    path = model.save(tmp_path / "model.npz")
    again = HGLMMModel.load(path)
    assert again.checksum() == model.checksum() and again.settings == model.settings
    feats2, _ = transform_captions(again, captions + ["1234 !!"], device="cpu")
    np.testing.assert_array_equal(feats2, feats)
    # refitting with the same seed is deterministic
    np.testing.assert_array_equal(fit_hglmm(s, captions, device="cpu", progress=False).pca_components,
                                  model.pca_components)


def test_fit_rejects_pca_larger_than_fisher_vector(toy_corpus):
    _, _, txt, _, captions = toy_corpus
    s = default_settings() | {"word_vectors": str(txt), "vocab_limit": 400, "fit_samples": 300, "components": 2,
                              "pca_dim": 33, "em_iterations": 2, "ica": False}
    with pytest.raises(XmrError, match="pca_dim 33 exceeds"):
        fit_hglmm(s, captions, device="cpu", progress=False)


def test_settings_from_config_with_dataset_block_and_overrides():
    s = load_text_feature_settings("hglmm", "f30k", "config")
    assert (s["components"], s["pca_dim"], s["ica"], s["fit_on"]) == (30, 6000, True, "vocab")
    s = load_text_feature_settings("hglmm", "synth", "config", ["pca_dim=64"])
    assert (s["word_vectors"], s["components"], s["pca_dim"]) == ("glove6b50d", 16, 64)
    with pytest.raises(XmrError, match="componets"):
        load_text_feature_settings("hglmm", "synth", "config", ["componets=4"])
    with pytest.raises(XmrError, match="no text-feature kind 'lda'"):
        load_text_feature_settings("lda", "synth", "config")
