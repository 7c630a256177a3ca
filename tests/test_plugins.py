"""A new method is one module plus one YAML file, a new re-ranker one module: both written outside the repository,
named in $XMR_PLUGINS, trained and evaluated through the workflow's target grammar and commands."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from xmr.run.layout import parse_target, result_path, run_dir

from conftest import run_xmr, xmr_env

REPO = Path(__file__).resolve().parents[1]

TOY_PLUGIN = '''
"""A toy method (mean-pooled features -> linear, mean-pooled BiGRU words) and a toy re-ranker (scores x factor)."""
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from xmr.losses.triplet import triplet_loss
from xmr.methods.base import METHODS, RetrievalModel, strict_section
from xmr.models.pooling import mean_pool
from xmr.rerank.base import RERANKERS, RerankerSpec, Rescoring


@dataclass(frozen=True)
class ToyModel:
    embed_dim: int


@dataclass(frozen=True)
class ToyLoss:
    margin: float


@METHODS.register("toy")
class Toy(RetrievalModel):
    model_settings_class, loss_settings_class = ToyModel, ToyLoss
    schema = {"type": "object", "properties": {
        "model": strict_section({"embed_dim": {"type": "integer", "minimum": 1}}),
        "loss": strict_section({"margin": {"type": "number", "minimum": 0, "default": 0.2}}),
    }}

    def __init__(self, settings, image_dim, vocab_words):
        super().__init__(settings, image_dim, vocab_words)
        self.proj = torch.nn.Linear(image_dim, self.embed_dim)
        self.text = self.build_text_encoder()

    def encode_image(self, feats, num_regions):
        return F.normalize(self.proj(mean_pool(feats, num_regions)), dim=-1)

    def encode_text(self, batch):
        h, lengths = self.text(batch)
        return F.normalize(mean_pool(h, lengths), dim=-1)

    def compute_loss(self, out, positives, epoch):
        return {"loss": triplet_loss(out["img"] @ out["txt"].t(), positives, self.loss_settings.margin, True, "sum")}


class Scaled(Rescoring):
    def __init__(self, sims, factor, block_bytes):
        super().__init__(sims, block_bytes)
        self.factor = factor

    def i2t_block(self, rows, cols):
        return self.factor * self.sims[rows, cols]

    t2i_block = i2t_block


RERANKERS.register("twice")(RerankerSpec(
    name="twice", summary="toy: every score times factor (rankings unchanged)", defaults={"factor": 2.0},
    prepare=lambda sims, p, ctx: Scaled(sims, p["factor"], ctx.block_bytes)))


# a re-ranker with an extra input: a file in the run directory (made by a rule of its own, as QB-Norm's bank),
# declared once on its spec; the workflow passes it as --rerank-param scale=runs/.../toy_scale.npy
RERANKERS.register("scaled")(RerankerSpec(
    name="scaled", summary="toy: every score times the number in the run's toy_scale.npy", defaults={"scale": None},
    prepare=lambda sims, p, ctx: Scaled(sims, float(p["scale"]), ctx.block_bytes),
    run_inputs={"scale": "toy_scale.npy"}))
'''


def _git_state() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout


def _xmr(env, cwd, *args) -> str:
    return run_xmr(*args, env=env, cwd=cwd, check=True).stdout


def test_toy_method_and_reranker_from_outside_the_package(tiny_synth, tmp_path):
    before = _git_state()
    plugin = tmp_path / "toy_plugin.py"
    plugin.write_text(TOY_PLUGIN)
    # the one YAML file: the toy recipe, in the project's recipe folder (here: the tiny project's)
    recipe = tiny_synth.config_dir / "recipes" / "synth" / "toy.yaml"
    recipe.parent.mkdir(parents=True, exist_ok=True)
    recipe.write_text(yaml.safe_dump({
        "method": "toy", "dataset": "synth",
        "features": {"backbone": "efficientnet_lite0", "dir": str(tiny_synth.features_dir)},
        "model": {"embed_dim": 16}, "loss": {},
        "optim": {"lr": 0.001}, "train": {"epochs": 1, "batch_size": 256, "val_max_images": 10},
        "eval": {"batch_size": 64}, "tracking": {"enabled": False}}))
    env = xmr_env(XMR_PLUGINS=str(plugin))
    project = tiny_synth.root
    cfg_dir = tiny_synth.config_dir

    # the target grammar: results/synth/toy.json trains recipe toy; toy_twice re-ranks it with `twice`
    assert parse_target("synth", "toy", cfg_dir) == ("toy", None)
    with pytest.raises(Exception, match="re-ranker suffixes"):
        parse_target("synth", "toy_twice", cfg_dir)  # without the plugin `twice` is no re-ranker
    check = subprocess.run([sys.executable, "-c", "from xmr.run.layout import parse_target; "
                            f"print(parse_target('synth', 'toy_twice', {str(cfg_dir)!r}))"],
                           env=env, capture_output=True, text=True)
    assert check.stdout.strip() == "('toy', 'twice')", check.stderr

    # the commands the workflow's rules run (train, score, test), from the project folder
    run = run_dir("synth", "toy")
    _xmr(env, project, "train", "--config", str(recipe), "--out-dir", str(run), "--no-progress")
    import torch

    last = torch.load(project / run / "last.pt", map_location="cpu", weights_only=True)
    assert last["step"] == 1 and last["epoch"] == 0  # 240 training captions in one batch of 256: one step
    sims = project / run / "test_sims.npy"
    _xmr(env, project, "score", "--run", str(run), "--out", str(sims), "--no-progress", "--device", "cpu")
    plain_out, twice_out = result_path("synth", "toy"), result_path("synth", "toy", "twice")
    assert (str(plain_out), str(twice_out)) == ("results/synth/toy.json", "results/synth/toy_twice.json")
    (project / plain_out).parent.mkdir(parents=True, exist_ok=True)
    _xmr(env, project, "test", "--run", str(run), "--sims", str(sims), "--out", str(plain_out), "--no-tracking")
    _xmr(env, project, "test", "--run", str(run), "--sims", str(sims), "--rerank", "twice", "--out", str(twice_out),
         "--no-tracking")
    plain = json.loads((project / plain_out).read_text())
    twice = json.loads((project / twice_out).read_text())
    assert plain["method"] == "toy" and plain["rerank"] == "none"
    assert twice["rerank"] == "twice" and twice["rerank_params"] == {"factor": 2.0}
    # scaling every score by 2 keeps every ranking, so every recall is the plain one
    assert twice["i2t"] == plain["i2t"] and twice["t2i"] == plain["t2i"] and twice["rsum"] == plain["rsum"]

    # the re-ranker with an extra input: the workflow reads its file from its spec (no name list anywhere) ...
    check = subprocess.run([sys.executable, "-c", "from xmr.planning.workflow_inputs import rerank_inputs, "
                            "rerank_options; "
                            f"print(rerank_inputs({str(run)!r}, 'scaled')); print(rerank_options({str(run)!r}, 'scaled'))"],
                           env=env, capture_output=True, text=True)
    assert check.stdout.splitlines() == [f"{{'scale': '{run}/toy_scale.npy'}}",
                                         f"--rerank scaled --rerank-param scale={run}/toy_scale.npy"], check.stderr
    # ... and the command the evaluate rule runs with it
    import numpy as np

    np.save(project / run / "toy_scale.npy", np.array(3.0))
    scaled_out = result_path("synth", "toy", "scaled")
    _xmr(env, project, "test", "--run", str(run), "--sims", str(sims), "--rerank", "scaled", "--rerank-param",
         f"scale={run}/toy_scale.npy", "--out", str(scaled_out), "--no-tracking")
    scaled = json.loads((project / scaled_out).read_text())
    assert scaled["rerank"] == "scaled" and scaled["rsum"] == plain["rsum"]
    assert _git_state() == before  # nothing in the repository was touched


def test_a_plugin_method_is_covered_by_the_conformance_test(tmp_path):
    """The registry's conformance test picks up a method registered through $XMR_PLUGINS with no edit to any list:
    its settings classes against its schema, build, a training step, score, reload and the inference API, for the
    toy method of the plugin above."""
    plugin = tmp_path / "toy_plugin.py"
    plugin.write_text(TOY_PLUGIN)
    env = xmr_env(XMR_PLUGINS=str(plugin))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(REPO / "tests" / "test_method_conformance.py"), "-k", "toy"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert re.search(r"^4 passed, \d+ deselected", r.stdout.splitlines()[-1]), r.stdout[-500:]
