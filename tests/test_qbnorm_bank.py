"""QB-Norm's query bank in the pipeline: `xmr score-bank` (bank queries from the training split) feeding
`xmr test --rerank qbnorm`, and the workflow wiring of its files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from xmr.core.errors import XmrError
from xmr.planning.workflow_inputs import rerank_inputs, rerank_options
from xmr.settings.run_settings import run_settings


@pytest.fixture(scope="module")
def trained(tiny_synth, module_tmp):
    from xmr.run.config import load_run_config
    from xmr.train.trainer import train

    out = module_tmp("qb") / "run"
    train(load_run_config(tiny_synth.recipe("vsepp", name="vsepp_qb")), out, progress=False)
    return out


def test_bank_shapes_and_values(trained):
    import torch

    from xmr.inference.loaders import load_split_images
    from xmr.inference.model import encode_split_of, load_trained, score_bank

    i2t, t2i, info = score_bank(trained, "train", max_images=7, device="cpu", progress=False)
    # tiny synth: 12 test images x 5 captions; the bank is the first 7 training images and their 35 captions
    assert i2t.shape == (7, 60) and t2i.shape == (12, 35)
    assert info == {"bank_split": "train", "bank_images": 7, "bank_captions": 35, "test_images": 12,
                    "test_captions": 60}
    # VSE++ scores are cosines of the two embeddings: recompute one entry of each matrix from the encoders
    model, cfg = load_trained(trained, "cpu")
    s = run_settings(cfg)
    cpu = torch.device("cpu")
    bank_img, bank_cap = encode_split_of(model, s, *load_split_images(s.image, s.dataset_config, "train"), cpu, 7)
    test_img, test_cap = encode_split_of(model, s, *load_split_images(s.image, s.dataset_config, "test"), cpu)
    assert np.isclose(i2t[3, 41], float(bank_img[3] @ test_cap[41]), atol=1e-5)
    assert np.isclose(t2i[11, 34], float(test_img[11] @ bank_cap[34]), atol=1e-5)
    with pytest.raises(XmrError, match="bank split 'test' is the test split"):
        score_bank(trained, "test", device="cpu", progress=False)


def test_cli_bank_then_qbnorm_evaluation(trained, tmp_path):
    from xmr.cli import main

    bank = {k: tmp_path / f"{k}.npy" for k in ("i2t", "t2i")}
    sims = tmp_path / "test_sims.npy"
    assert main(["score", "--run", str(trained), "--out", str(sims), "--no-progress"]) == 0
    assert main(["score-bank", "--run", str(trained), "--max-images", "10", "--out-i2t", str(bank["i2t"]),
                 "--out-t2i", str(bank["t2i"]), "--no-progress"]) == 0
    out = tmp_path / "qb.json"
    assert main(["test", "--run", str(trained), "--sims", str(sims), "--rerank", "qbnorm", "--rerank-param",
                 f"bank_i2t={bank['i2t']}", f"bank_t2i={bank['t2i']}", "--out", str(out), "--no-tracking"]) == 0
    res = json.loads(out.read_text())
    assert res["rerank"] == "qbnorm" and res["rerank_params"]["bank_i2t"] == str(bank["i2t"])
    assert 0 <= res["rsum"] <= 600


def test_workflow_wires_the_bank_files_for_qbnorm_only():
    assert rerank_inputs("runs/coco/dvse", "qbnorm") == {"bank_i2t": "runs/coco/dvse/qbnorm_bank_i2t.npy",
                                                         "bank_t2i": "runs/coco/dvse/qbnorm_bank_t2i.npy"}
    assert rerank_inputs("runs/coco/dvse", "fr") == {} and rerank_options("runs/coco/dvse", None) == ""
    assert rerank_options("runs/coco/dvse", "fr") == "--rerank fr"
    assert rerank_options("runs/coco/dvse", "qbnorm") == ("--rerank qbnorm --rerank-param "
                                                          "bank_i2t=runs/coco/dvse/qbnorm_bank_i2t.npy "
                                                          "bank_t2i=runs/coco/dvse/qbnorm_bank_t2i.npy")
