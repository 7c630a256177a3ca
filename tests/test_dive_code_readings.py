"""DivE's released-code readings as options (kdwonn/DivE): the image projection's MLP on the projected features
(``model.image_mlp_input``), the caption dropout in the code's three places (``model.text_dropout``), and which
parameters the SPM learning-rate scale reaches (``model.spm_lr_scope``). Expectations are built by hand from the
modules' own weights."""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import pad_packed_sequence

from xmr.models.image import LocalProjection
from xmr.models.set_heads import POOLS


def _mlp_by_hand(mlp, z: torch.Tensor) -> torch.Tensor:
    """Linear -> BatchNorm1d (training mode: the rows' own mean and biased variance) -> ReLU -> Linear, on (N, d)."""
    lin1, bn, lin2 = mlp.layers[0], mlp.norms[0], mlp.layers[1]
    h = z @ lin1.weight.T + lin1.bias
    h = (h - h.mean(0)) / torch.sqrt(h.var(0, unbiased=False) + bn.eps) * bn.weight + bn.bias
    return torch.relu(h) @ lin2.weight.T + lin2.bias


@pytest.mark.parametrize("mlp_input", ["local", "projected"])
def test_image_projection_mlp_reads_the_raw_or_the_projected_features(mlp_input):
    torch.manual_seed(0)
    proj = LocalProjection(in_dim=6, embed_dim=8, residual_mlp=True, mlp_input=mlp_input).train()
    with torch.no_grad():
        proj.mlp.norms[0].weight.uniform_(0.5, 1.5)  # not the identity affine, so the BatchNorm is checked too
        proj.mlp.norms[0].bias.uniform_(-0.5, 0.5)
    x = torch.randn(3, 5, 6)
    out = proj(x)
    flat = x.reshape(-1, 6)
    fc = flat @ proj.fc.weight.T + proj.fc.bias  # (15, 8)
    if mlp_input == "projected":  # kdwonn/DivE EncoderImage --gpo_1x1: fc(x) + MLP(fc(x)), the MLP D -> D/2 -> D
        assert [tuple(layer.weight.shape) for layer in proj.mlp.layers] == [(4, 8), (8, 4)]
        want = fc + _mlp_by_hand(proj.mlp, fc)
    else:  # VSE∞: fc(x) + MLP(x), the MLP F -> D/2 -> D
        assert [tuple(layer.weight.shape) for layer in proj.mlp.layers] == [(4, 6), (8, 4)]
        want = fc + _mlp_by_hand(proj.mlp, flat)
    torch.testing.assert_close(out, want.reshape(3, 5, 8), rtol=1e-5, atol=1e-5)


def _dive(tiny_synth, **model):
    from xmr.methods import METHODS
    from xmr.run.config import load_run_config
    from xmr.text.vocab import SPECIALS

    model = {"embed_dim": 16, "num_embeds": 2, "iterations": 1, "heads": 2, "dim_head": 4, "dropout": 0.0,
             "text_augment": 0.0, **model}
    cfg = load_run_config(tiny_synth.recipe("dive", name="dive_readings", model=model,
                                            text={"word_vectors": None, "word_dim": 8}))
    torch.manual_seed(0)
    return METHODS.get("dive").from_config(cfg, 8, list(SPECIALS) + ["red", "ball", "big"]), cfg


def test_dive_builds_the_projected_mlp_from_its_option(tiny_synth):
    model, _ = _dive(tiny_synth, image_mlp_input="projected")
    assert model.image_proj.mlp.layers[0].in_features == 16 and model.image_proj.projected
    model, _ = _dive(tiny_synth)
    assert model.image_proj.mlp.layers[0].in_features == 8  # default: VSE∞'s order, on the 8-d features


CAPTIONS = ["red ball", "big red ball", "ball"]


def _text(model):
    return model.text.collate(CAPTIONS, [c.split() for c in CAPTIONS])


@pytest.mark.parametrize("local,glob", [("words", "last_hidden"), ("hidden", "max")])
def test_caption_dropout_hits_the_word_embeddings_the_gru_outputs_and_the_last_state(tiny_synth, local, glob):
    """kdwonn/DivE model_spm.py EncoderText.forward: dropout on the word embeddings (what the GRU and the text SPM
    read), on the GRU outputs and on the final state. Hooks record what passes through the dropout and what the
    GRU and the SPM receive."""
    model, _ = _dive(tiny_synth, text_dropout=0.5, text_local=local, text_global=glob)
    calls, gru_in, spm_in = [], [], []
    model.text_dropout.register_forward_hook(lambda m, args, out: calls.append((args[0], out)))
    model.text.rnn.register_forward_pre_hook(lambda m, args: gru_in.append(args[0]))
    model.text_spm.register_forward_pre_hook(lambda m, args: spm_in.append(args))
    model.train()
    text = _text(model)
    torch.manual_seed(1)
    model.text_outputs(text)
    b, t = text["ids"].shape
    assert [tuple(x.shape) for x, _ in calls] == [(b, t, 8), (b, t, 16), (b, 16)]  # words, outputs, last state
    for x, y in calls:  # p = 0.5 in training: some entries zeroed, the rest scaled by 2
        assert (y == 0).any() and torch.allclose(y[y != 0], 2 * x[y != 0])
    (words_in, words), (outputs_in, outputs), (_, last) = calls
    assert torch.equal(words_in, model.text.embed(text["ids"]))
    gru_words, _ = pad_packed_sequence(gru_in[0], batch_first=True, total_length=t)
    valid = torch.arange(t)[None, :] < text["lengths"][:, None]
    assert torch.equal(gru_words[valid], words[valid])  # the GRU reads the dropped word embeddings
    spm_local, lengths, spm_global = spm_in[0][:3]
    if local == "words":  # the SPM reads the same dropped word embeddings (one mask), the global is the last state
        assert torch.equal(spm_local, words) and torch.equal(spm_global, last)
    else:  # the SPM reads the dropped outputs, and the max-pool is taken over them
        assert torch.equal(spm_local, outputs)
        assert torch.equal(spm_global, POOLS["max"](outputs, lengths))


def test_caption_dropout_is_off_in_eval_mode_and_at_zero(tiny_synth):
    on, _ = _dive(tiny_synth, text_dropout=0.5)
    off, _ = _dive(tiny_synth)
    assert off.text_dropout is None and on.state_dict().keys() == off.state_dict().keys()
    off.load_state_dict(on.state_dict())
    on.eval(), off.eval()
    text = _text(on)
    with torch.no_grad():
        assert torch.equal(on.text_outputs(text)["txt"], off.text_outputs(text)["txt"])
        on.train(), off.train()
        torch.manual_seed(3)
        trained_on = on.text_outputs(text)["txt"]
        torch.manual_seed(3)
        assert not torch.allclose(trained_on, off.text_outputs(text)["txt"])  # training mode: it drops


def _groups(model, cfg) -> dict[str, tuple[float, set[str]]]:
    """The trainer's optimizer groups as {group name: (lr, parameter names)}."""
    from xmr.train.step import build_optimizer

    names = {id(p): n for n, p in model.named_parameters()}
    opt = build_optimizer(model, cfg["optim"])
    return {g["name"]: (g["lr"], {names[id(p)] for p in g["params"]}) for g in opt.param_groups}


def test_spm_lr_scope_code_scales_the_image_side_and_the_text_spm(tiny_synth):
    model, cfg = _dive(tiny_synth, spm_lr_scale=0.1)
    lr = cfg["optim"]["lr"]
    groups = _groups(model, cfg)
    names = {n for n, _ in model.named_parameters()}
    scaled = {n for n in names if n.split(".")[0] in ("image_proj", "image_spm", "text_spm")}
    assert groups["spm"] == (pytest.approx(lr * 0.1), scaled)
    assert groups["main"] == (pytest.approx(lr), names - scaled)
    assert {"image_proj.fc.weight", "image_spm.ln_global.weight", "text_spm.ln_global.bias"} <= scaled
    assert "text.embed.weight" in groups["main"][1] and "text.rnn.weight_hh_l0" in groups["main"][1]


def test_spm_lr_scope_paper_scales_the_set_prediction_modules_alone(tiny_synth):
    model, cfg = _dive(tiny_synth, spm_lr_scale=0.1, spm_lr_scope="paper")
    lr = cfg["optim"]["lr"]
    groups = _groups(model, cfg)
    names = {n for n, _ in model.named_parameters()}
    scaled = {n for n in names if n.split(".")[0] in ("image_spm", "text_spm") and n.split(".")[1] != "ln_global"}
    assert groups["spm"] == (pytest.approx(lr * 0.1), scaled)
    assert groups["main"] == (pytest.approx(lr), names - scaled)
    # the projection and the global feature's LayerNorms at the base lr; the slots, blocks and LN_out scaled
    assert {"image_proj.fc.weight", "image_proj.mlp.layers.0.weight", "image_spm.ln_global.weight",
            "text_spm.ln_global.weight"} <= groups["main"][1]
    assert {"image_spm.slots", "text_spm.block.to_q.weight", "image_spm.ln_out.weight"} <= scaled


def test_spm_lr_scope_without_the_set_modules(tiny_synth):
    """DivE's base (model.set_module: false): the code's scope still scales the projection and the global
    LayerNorms; the paper's has nothing to scale, so every parameter trains at the base lr."""
    model, cfg = _dive(tiny_synth, spm_lr_scale=0.1, set_module=False)
    groups = _groups(model, cfg)
    assert groups["spm"][1] == {n for n, _ in model.named_parameters()
                                if n.split(".")[0] in ("image_proj", "image_global_norm", "text_global_norm")}
    model, cfg = _dive(tiny_synth, spm_lr_scale=0.1, set_module=False, spm_lr_scope="paper")
    groups = _groups(model, cfg)
    assert list(groups) == ["main"] and groups["main"][1] == {n for n, _ in model.named_parameters()}
