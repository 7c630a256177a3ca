"""Training-time augmentation (xmr.models.augment) and its use in DivE: counts worked out by hand, nothing
dropped in eval mode, the dropped inputs are exactly what the model encodes in training mode."""

import math

import pytest
import torch

from xmr.run.config import load_run_config
from xmr.models.augment import augment_token_ids, drop_regions, region_keep_mask
from xmr.train.trainer import train


def test_count_mode_drops_floor_p_n_regions_and_never_padding():
    lengths = torch.tensor([4, 3, 1, 6])
    g = torch.Generator().manual_seed(0)
    keep = region_keep_mask(lengths, 6, "count", 0.5, generator=g)
    # floor(0.5·n) dropped: 4 -> 2 kept, 3 -> 2 (floor 1.5 = 1 dropped), 1 -> 1 (floor 0.5 = 0), 6 -> 3
    assert keep.sum(1).tolist() == [2, 2, 1, 3]
    assert not keep[torch.arange(6)[None, :] >= lengths[:, None]].any()  # padded positions never kept
    # p = 1 drops every region, then the keep-at-least-one rule restores the first
    all_gone = region_keep_mask(lengths, 6, "count", 1.0, generator=g)
    assert all_gone.sum(1).tolist() == [1, 1, 1, 1] and all_gone[:, 0].all()


def test_region_mode_keeps_one_minus_p_on_average_and_is_reproducible():
    lengths = torch.full((4000,), 36)
    keep = region_keep_mask(lengths, 36, "region", 0.2, generator=torch.Generator().manual_seed(1))
    # each of 36 regions kept with prob 0.8: 28.8 on average (std of the mean over 4000 images ≈ 0.04)
    assert keep.sum(1).float().mean().item() == pytest.approx(28.8, abs=0.2)
    again = region_keep_mask(lengths, 36, "region", 0.2, generator=torch.Generator().manual_seed(1))
    assert torch.equal(keep, again)
    feats = torch.ones(2, 5, 3)
    same, n = drop_regions(feats, torch.tensor([5, 2]), "none", 0.2)
    assert same is feats and n.tolist() == [5, 2]


def test_token_styles_delete_and_unk_then_delete_by_hand():
    # <start>=1, inner words 10.., <end>=2, pad 0; caption lengths 6 (4 words) and 5 (3 words)
    ids = torch.tensor([[1, 10, 11, 12, 13, 2], [1, 20, 21, 22, 2, 0]])
    lengths = torch.tensor([6, 5])
    g = torch.Generator().manual_seed(0)
    out, n = augment_token_ids(ids, lengths, 1.0, mask_id=3, random_low=4, random_high=9, style="delete",
                               generator=g)
    assert out.tolist() == [[1, 2], [1, 2]] and n.tolist() == [2, 2]  # p = 1: every word deleted
    out, n = augment_token_ids(ids, lengths, 0.5, mask_id=3, random_low=4, random_high=9, style="unk_then_delete",
                               generator=g)
    # PCME: floor(0.5·4) = 2 and floor(0.5·3) = 1 words deleted; the survivors keep their order or became <unk>
    assert n.tolist() == [4, 4]
    for row, length, words in zip(out.tolist(), n.tolist(), ([10, 11, 12, 13], [20, 21, 22])):
        assert row[0] == 1 and row[length - 1] == 2
        inner = row[1:length - 1]
        originals = [v for v in inner if v != 3]
        assert all(v in words for v in originals) and originals == sorted(originals)
    same, n_same = augment_token_ids(ids, lengths, 0.0, mask_id=3, random_low=4, random_high=9,
                                     style="unk_then_delete")
    assert torch.equal(same, ids) and torch.equal(n_same, lengths)


def _tiny_dive(tiny_synth, **model):
    from xmr.methods import METHODS
    from xmr.text.vocab import SPECIALS

    model = {"num_embeds": 2, "iterations": 1, "heads": 2, "dim_head": 8, "dropout": 0.0,
             "image_residual_mlp": False, "image_global_pool": "mean", **model}
    cfg = load_run_config(tiny_synth.recipe("dive", name="dive_unit", model=model,
                                            text={"word_vectors": None, "word_dim": 8}))
    torch.manual_seed(0)
    return METHODS.get("dive").from_config(cfg, 8, list(SPECIALS) + ["red", "ball", "big"])


def _batch(model):
    feats = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(3))
    text = model.text.collate(["red ball", "big red ball"], [["red", "ball"], ["big", "red", "ball"]])
    return feats, torch.tensor([4, 2]), text


def test_dive_eval_mode_drops_nothing(tiny_synth):
    on = _tiny_dive(tiny_synth, size_augment={"mode": "region", "p": 0.9}, text_augment=0.9)
    off = _tiny_dive(tiny_synth, size_augment={"mode": "none"}, text_augment=0.0)
    off.load_state_dict(on.state_dict())
    on.eval(), off.eval()
    feats, nr, text = _batch(on)
    with torch.no_grad():
        fwd = on(feats, nr, text)
        img, cap = fwd["img"], fwd["txt"]
        img2, cap2 = on.encode_image(feats, nr), on.encode_text(text)
        img_off, cap_off = off.encode_image(feats, nr), off.encode_text(text)
    assert torch.equal(img, img2) and torch.equal(cap, cap2)
    assert torch.equal(img, img_off) and torch.equal(cap, cap_off)


@pytest.mark.parametrize("pos_enc", ["none", "sine2d"])
def test_dive_training_mode_encodes_the_dropped_inputs(tiny_synth, pos_enc):
    model = _tiny_dive(tiny_synth, size_augment={"mode": "count", "p": 0.5}, text_augment=1.0,
                       text_augment_style="delete", image_pos_enc=pos_enc)
    feats, nr, text = _batch(model)
    model.train()
    torch.manual_seed(5)
    with torch.no_grad():
        fwd = model(feats, nr, text)
        img_train, cap_train = fwd["img"], fwd["txt"]
    torch.manual_seed(5)  # the same draw: count mode keeps 4 - floor(2) = 2 and 2 - floor(1) = 1 regions
    keep = region_keep_mask(nr, 4, "count", 0.5)
    assert keep.sum(1).tolist() == [2, 1]
    model.eval()
    with torch.no_grad():
        if pos_enc == "none":
            kept = torch.zeros_like(feats[:, :2])
            for i in range(2):
                kept[i, : int(keep[i].sum())] = feats[i, keep[i]]
            img_want = model.encode_image(kept, keep.sum(1))
        else:
            # grid positions travel with their cells: feed the set prediction module the kept cells (projected
            # per cell, so projecting first is the same) together with their own 2-D positions
            from xmr.models.set_heads import POOLS
            from xmr.models.slot_attention import sine_positions_2d

            pos = sine_positions_2d(4, 32)
            local = model.image_proj(feats)
            rows = [local[i, keep[i]] for i in range(2)]
            ctx = torch.zeros(2, 2, 32)
            ctx_pos = torch.zeros(2, 2, 32)
            for i in range(2):
                ctx[i, : len(rows[i])] = rows[i]
                ctx_pos[i, : len(rows[i])] = pos[keep[i]]
            n = keep.sum(1)
            img_want = model.image_spm(ctx, n, POOLS["mean"](ctx, n), ctx_pos)["embeddings"]
        # text_augment 1.0 with style delete removes every word: each caption is <start> <end>
        cap_want = model.encode_text(model.text.collate(["", ""], [[], []]))
    torch.testing.assert_close(img_train, img_want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cap_train, cap_want, atol=1e-5, rtol=1e-5)


def test_dive_trains_with_the_paper_reading_of_the_augmentation(tiny_synth, tmp_path):
    cfg = load_run_config(tiny_synth.recipe(
        "dive", name="dive_paper_aug", text={"word_vectors": None, "word_dim": 16},
        model={"num_embeds": 2, "iterations": 1, "heads": 2, "dim_head": 8, "image_global_pool": "mean",
               "image_pos_enc": "sine2d", "size_augment": {"mode": "count", "p": 0.2},
               "text_augment_style": "delete"}))
    summary = train(cfg, tmp_path / "run", progress=False)
    assert summary["best_epoch"] == 1
    assert all(math.isfinite(r["loss"]) and r["loss"] > 0 for r in summary["history"])
