"""Text features: GloVe / word2vec text readers on generated fixtures, the shipped GloVe 6B 50d, and the real
MiniLM through BertEncoder (offline)."""

import numpy as np
import pytest
import torch

from xmr.core.errors import XmrError
from xmr.text.word_vectors import embedding_matrix, load_word_vectors, read_text_vectors, read_word2vec_binary


def test_glove_text_any_dimension(tmp_path):
    p = tmp_path / "glove.4d.txt"
    # a token with a space (glove.840B has some), a repeated word (first vector wins), a trailing blank line
    p.write_text("the 0.1 0.2 0.3 0.4\nat & t 1 2 3 4\ncat -1.5 0 2.25 1e-2\nthe 9 9 9 9\n\n")
    index, mat = read_text_vectors(p)
    assert set(index) == {"the", "at & t", "cat"} and mat.shape == (3, 4) and mat.dtype == np.float32
    np.testing.assert_array_equal(mat[index["the"]], np.float32([0.1, 0.2, 0.3, 0.4]))
    np.testing.assert_array_equal(mat[index["at & t"]], [1, 2, 3, 4])
    np.testing.assert_array_equal(mat[index["cat"]], np.float32([-1.5, 0, 2.25, 0.01]))
    index, mat = read_text_vectors(p, wanted={"cat", "dog"})
    assert list(index) == ["cat"] and mat.shape == (1, 4)


def test_word2vec_text_format(tmp_path):
    p = tmp_path / "w2v.txt"
    p.write_text("2 3\nking 0.5 0.25 -1\nqueen 1 2 3\n")
    index, mat = read_text_vectors(p)
    np.testing.assert_array_equal(mat[index["queen"]], [1, 2, 3])
    p.write_text("3 3\nking 0.5 0.25 -1\nqueen 1 2 3\n")
    with pytest.raises(XmrError, match=r"w2v\.txt: the word2vec header declares 3 words, the file holds 2"):
        read_text_vectors(p)


@pytest.mark.parametrize("body, pattern", [
    ("a 1 2 3\nb 1 2\nc 1 2 3\n", r"bad\.txt:2: expected a word and 3 numbers, got 3 fields"),
    ("a 1 2 3\nb 1 x 3\n", r"bad\.txt:2: non-numeric vector value"),
    ("2 3\na 1 2 3\nb 1 2\n", r"bad\.txt:3: expected a word and 3 numbers"),
    ("", r"bad\.txt: empty word-vector file"),
])
def test_malformed_word_vectors_name_file_and_line(tmp_path, body, pattern):
    p = tmp_path / "bad.txt"
    p.write_text(body)
    with pytest.raises(XmrError, match=pattern):
        read_text_vectors(p)


W2V_WORDS = ["king", "queen", "Zürich"]
W2V_VECS = np.array([[1.0, -2.0, 0.5], [0.25, 3.0, -1.5], [7.0, 0.0, -0.125]], np.float32)


def write_w2v_binary(path, words=W2V_WORDS, vecs=W2V_VECS, newline=True, header=None):
    """word2vec binary: C ``word2vec`` writes ``word `` + floats + ``\\n``; gensim's save_word2vec_format
    (binary=True) writes ``word `` + floats with no newline."""
    body = b"".join(w.encode() + b" " + v.astype("<f4").tobytes() + (b"\n" if newline else b"")
                    for w, v in zip(words, vecs))
    path.write_bytes((header or f"{len(words)} {vecs.shape[1]}\n").encode() + body)
    return path


@pytest.mark.parametrize("newline", [True, False], ids=["c_word2vec", "gensim"])
def test_word2vec_binary_layouts(tmp_path, newline):
    p = write_w2v_binary(tmp_path / "vectors.bin", newline=newline)
    index, mat = load_word_vectors(str(p))
    assert index == {"king": 0, "queen": 1, "Zürich": 2}
    np.testing.assert_array_equal(mat, W2V_VECS)
    index, mat, head = read_word2vec_binary(p, wanted={"Zürich"}, head=1)
    assert head == ["king"] and index == {"king": 0, "Zürich": 1}
    np.testing.assert_array_equal(mat, W2V_VECS[[0, 2]])
    # no .bin suffix: recognised by its content
    q = tmp_path / "vectors.w2v"
    q.write_bytes(p.read_bytes())
    mat2, coverage = embedding_matrix(["<pad>", "queen", "zebra"], str(q), dim=3)
    np.testing.assert_array_equal(mat2[1], W2V_VECS[1])
    assert coverage == pytest.approx(1 / 3)


def test_word2vec_binary_streams_and_stops_early(tmp_path):
    p = write_w2v_binary(tmp_path / "v.bin")
    data = p.read_bytes()
    p.write_bytes(data[:-5])  # the last record is cut: never reached when only the first word is wanted
    index, mat, head = read_word2vec_binary(p, head=1)
    assert head == ["king"] and mat.shape == (1, 3)


@pytest.mark.parametrize("mutate, pattern", [
    # header "3 3\n" is 4 bytes; record 1 = "king " + 12 + "\n" (18), record 2 = "queen " + 12 + "\n" (19)
    (lambda b: b[:-5], r"v\.bin: record 3 of 3 \('Zürich', byte 41\): truncated vector, 8 of 12 bytes"),
    (lambda b: b[:41], r"v\.bin: truncated: the file ends after 2 of the 3 records the header declares "
                       r"\(byte 41\)"),
    (lambda b: b"3 x\n" + b[4:], r"v\.bin:1: bad word2vec header '3 x'"),
    (lambda b: b"2 3\n" + b[4:], r"v\.bin: byte 41: data after the 2 records the header declares"),
    (lambda b: b"3 3\n" + b"x" * 5000, r"v\.bin: record 1 of 3 \(byte 4\): no word \(no space within 4096 "
                                        r"bytes\)"),
], ids=["truncated_vector", "missing_records", "bad_header", "count_too_small", "no_word"])
def test_malformed_word2vec_binary(tmp_path, mutate, pattern):
    p = write_w2v_binary(tmp_path / "v.bin")
    p.write_bytes(mutate(p.read_bytes()))
    with pytest.raises(XmrError, match=pattern):
        load_word_vectors(str(p))


def test_embedding_matrix_coverage(tmp_path):
    p = tmp_path / "v.txt"
    p.write_text("dog 1 2\ncat 3 4\n")
    words = ["<pad>", "<unk>", "<start>", "<end>", "dog", "zebra"]
    mat, coverage = embedding_matrix(words, str(p), dim=8)
    assert mat.shape == (6, 2) and coverage == pytest.approx(1 / 6)  # only "dog" is covered
    np.testing.assert_array_equal(mat[4], [1, 2])
    np.testing.assert_array_equal(mat[0], [0, 0])


def test_shipped_glove_6b_50d():
    index, mat = load_word_vectors("glove6b50d", wanted={"the", "horse", "notawordxyz"})
    assert set(index) == {"the", "horse"} and mat.shape == (2, 50)
    np.testing.assert_allclose(mat[index["the"]][:3], [0.418, 0.24968, -0.41242], rtol=1e-6)


def test_minilm_offline_mean_pooled_similarity():
    from xmr.models.text import BertEncoder

    enc = BertEncoder({"bert_path": "minilm", "max_len": 32}, embed_dim=16).eval()
    caps = ["man riding a horse on a beach", "person rides a horse along the shore", "two cats on a sofa"]
    batch = enc.collate(caps, [c.split() for c in caps])
    with torch.no_grad():
        h = enc.bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        feats, lengths = enc(batch)
    assert h.shape[-1] == 384 and feats.shape == (3, h.shape[1], 16)
    assert lengths.tolist() == batch["attention_mask"].sum(1).tolist()
    mask = batch["attention_mask"].unsqueeze(-1).float()
    emb = torch.nn.functional.normalize((h * mask).sum(1) / mask.sum(1), dim=-1)
    paraphrase, unrelated = float(emb[0] @ emb[1]), float(emb[0] @ emb[2])
    assert paraphrase > 0.5 > unrelated  # measured on this model: 0.757 vs -0.012
