"""PIE-Net set heads and DivE slot attention: shapes, masking, and the formulas recomputed naively."""

import math

import pytest
import torch

from xmr.models.set_heads import MultiHeadSelfAttention, PIENet, last_pool
from xmr.models.slot_attention import AggregationBlock, SetPredictionModule, sine_positions_1d, sine_positions_2d


def test_multi_head_self_attention_matches_formula_and_ignores_padding():
    torch.manual_seed(0)
    att = MultiHeadSelfAttention(num_heads=3, in_dim=4, hidden_dim=5)
    x = torch.randn(2, 6, 4)
    lengths = torch.tensor([6, 4])
    pooled, attn = att(x, lengths)
    assert pooled.shape == (2, 3, 4) and attn.shape == (2, 3, 6)
    # naive: A = softmax over valid r of W2 tanh(W1 x_r), per sample and head
    for b in range(2):
        n = int(lengths[b])
        logits = att.w2.weight @ torch.tanh(att.w1.weight @ x[b, :n].T)  # (3, n)
        a = torch.softmax(logits, dim=1)
        assert torch.allclose(attn[b, :, :n], a, atol=1e-6)
        assert torch.all(attn[b, :, n:] == 0)
        assert torch.allclose(pooled[b], a @ x[b, :n], atol=1e-6)
    # padded positions never matter: change them and nothing moves
    x2 = x.clone()
    x2[1, 4:] = 100.0
    assert torch.allclose(att(x2, lengths)[0], pooled)


def test_pienet_residual_layernorm_and_gate():
    torch.manual_seed(0)
    pie = PIENet(num_embeds=2, in_dim=4, embed_dim=3, hidden_dim=5)
    g, local, lengths = torch.randn(2, 3), torch.randn(2, 5, 4), torch.tensor([5, 3])
    out = pie(g, local, lengths)
    pooled, _ = pie.attention(local, lengths)
    residual = torch.sigmoid(pooled @ pie.fc.weight.T + pie.fc.bias)
    assert torch.allclose(out["residuals"], residual, atol=1e-6)
    assert torch.allclose(out["embeddings"], torch.layer_norm(g[:, None] + residual, (3,)), atol=1e-5)
    # a gate of 0 leaves LN(g) in that slot; the returned residuals are the ungated ones
    gate = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    gated = pie(g, local, lengths, gate)
    assert torch.allclose(gated["embeddings"][0, 0], out["embeddings"][0, 0], atol=1e-6)
    assert torch.allclose(gated["embeddings"][0, 1], torch.layer_norm(g[0], (3,)), atol=1e-5)
    assert torch.allclose(gated["residuals"], out["residuals"])


def test_last_pool_takes_last_valid_position():
    x = torch.arange(12.0).view(2, 3, 2)
    assert last_pool(x, torch.tensor([3, 1])).tolist() == [[4.0, 5.0], [6.0, 7.0]]


def test_slot_attention_competes_over_slots_then_averages_inputs():
    torch.manual_seed(0)
    block = AggregationBlock(in_dim=4, slot_dim=6, heads=1, dim_head=5, dropout=0.0)
    slots, ctx = torch.randn(2, 3, 6), torch.randn(2, 5, 4)
    valid = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    updates, attn = block.attention(slots, ctx, valid)
    assert attn.shape == (2, 1, 3, 5)
    # naive: logits k_n · q_k / √d, softmax over the 3 slots, zero padded inputs, renormalise over inputs
    c = torch.layer_norm(ctx, (4,), block.ln_ctx.weight, block.ln_ctx.bias)
    q = block.to_q(torch.layer_norm(slots, (6,), block.ln_q.weight, block.ln_q.bias))
    k, v = block.to_k(c), block.to_v(c)
    a = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(5), dim=1)  # (B, K, N), over slots
    a = a * valid[:, None, :]
    a = a / (a.sum(-1, keepdim=True) + 1e-7)
    assert torch.allclose(attn[:, 0], a, atol=1e-6)
    assert torch.allclose(attn.sum(-1), torch.ones(2, 1, 3), atol=1e-5)  # weighted means over inputs
    assert torch.allclose(updates, block.to_out(a @ v), atol=1e-6)


def test_code_padding_gives_every_slot_one_kth_of_a_padded_input():
    """pad_mode: code, kdwonn/DivE agg_block/attention.py: a padded input's logits are -finfo.max before the softmax
    over the K slots, so each slot's share of it is exactly 1/K, and it stays in the renormalisation over inputs
    (and in the weighted mean of the values)."""
    torch.manual_seed(0)
    k_slots = 3
    block = AggregationBlock(in_dim=4, slot_dim=6, heads=1, dim_head=5, dropout=0.0, pad_mode="code")
    slots, ctx = torch.randn(2, k_slots, 6), torch.randn(2, 5, 4)
    ctx[1, 3:] = 5.0 * torch.randn(2, 4)  # what the padding holds: its own logits would give it another share
    valid = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    updates, attn = block.attention(slots, ctx, valid)
    c = torch.layer_norm(ctx, (4,), block.ln_ctx.weight, block.ln_ctx.bias)
    q = block.to_q(torch.layer_norm(slots, (6,), block.ln_q.weight, block.ln_q.bias))
    k, v = block.to_k(c), block.to_v(c)
    logits = q @ k.transpose(1, 2) / math.sqrt(5)  # (B, K, N)
    slot_softmax = torch.softmax(logits, dim=1)  # the valid inputs' shares, over the slots
    slot_softmax[1, :, 3:] = 1.0 / k_slots  # a padded input: exactly 1/K of it to every slot
    by_hand = slot_softmax / (slot_softmax.sum(-1, keepdim=True) + 1e-7)  # over all 5 inputs, padded included
    assert torch.allclose(attn[:, 0], by_hand, atol=1e-6)
    # the padded share, (1/K) / Σ_n A[n, k], and the pre-renormalisation share it implies, 1/K
    denominator = slot_softmax[1].sum(-1) + 1e-7  # (K,)
    assert torch.allclose(attn[1, 0, :, 3], (1.0 / k_slots) / denominator, atol=1e-6)
    assert torch.allclose(attn[1, 0, :, 3:] * denominator[:, None], torch.full((k_slots, 2), 1.0 / k_slots),
                          atol=1e-6)
    assert not torch.allclose(torch.softmax(logits, dim=1)[1, :, 3:], torch.full((k_slots, 2), 1.0 / k_slots),
                              atol=1e-3)  # the padding's own logits would not give 1/K (the test can fail)
    assert torch.allclose(updates, block.to_out(by_hand @ v), atol=1e-6)  # padded values enter the mean
    # the unpadded sample is untouched by the mode
    zero = AggregationBlock(4, 6, heads=1, dim_head=5, dropout=0.0, pad_mode="zero")
    zero.load_state_dict(block.state_dict())
    assert torch.allclose(zero.attention(slots, ctx, valid)[1][0], attn[0], atol=1e-7)


def test_set_prediction_module_output_and_switches():
    torch.manual_seed(0)
    spm = SetPredictionModule(in_dim=4, embed_dim=6, num_slots=3, iterations=2, heads=2, dim_head=4, dropout=0.0)
    local, lengths, glob = torch.randn(2, 5, 4), torch.tensor([5, 2]), torch.randn(2, 6)
    out = spm(local, lengths, glob)
    assert out["embeddings"].shape == (2, 3, 6)
    assert torch.allclose(out["embeddings"].norm(dim=-1), torch.ones(2, 3), atol=1e-5)
    # S = l2norm(LN_out(E^T) + LN_g(global))
    expected = torch.nn.functional.normalize(out["slots"] + spm.ln_global(glob)[:, None], dim=-1)
    assert torch.allclose(out["embeddings"], expected, atol=1e-6)
    # padding-invariant: what lies beyond a sample's length does not change its set
    local2 = local.clone()
    local2[1, 2:] = 50.0
    assert torch.allclose(spm(local2, lengths, glob)["embeddings"], out["embeddings"], atol=1e-5)
    no_global = SetPredictionModule(4, 6, 3, 2, 2, 4, dropout=0.0, add_global=False)
    no_global.load_state_dict(spm.state_dict())
    ng = no_global(local, lengths, glob)
    assert torch.allclose(ng["embeddings"], torch.nn.functional.normalize(ng["slots"], dim=-1), atol=1e-6)
    gru = SetPredictionModule(4, 6, 3, 2, 2, 4, dropout=0.0, learnable_slots=False, update="gru").eval()
    assert gru(local, lengths, glob)["embeddings"].shape == (2, 3, 6)


def test_sine_positions():
    # 1-D: normalised by each caption's own length, so padding a caption does not change its encoding
    short = sine_positions_1d(torch.tensor([4]), 4, 6)
    padded = sine_positions_1d(torch.tensor([4, 7]), 7, 6)
    assert torch.allclose(short[0], padded[0, :4])
    # position 0 -> sin(0) = 0, cos(0) = 1 on the first frequency
    assert short[0, 0, 0].item() == 0.0 and short[0, 0, 3].item() == 1.0
    p = sine_positions_2d(9, 8)
    assert p.shape == (9, 8)
    assert torch.equal(p[0, :4], p[1, :4])  # same row -> same y half
    assert torch.equal(p[0, 4:], p[3, 4:])  # same column -> same x half
    with pytest.raises(Exception, match="square"):
        sine_positions_2d(10, 8)
