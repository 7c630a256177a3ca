"""The `xmr import-checkpoint` lines of docs/checkpoints.md, run as printed (only file paths substituted) on
fixtures in each reference's official container, then `xmr.load(RUN)` on raw captions and image files: the
embeddings equal what the reference code computed on the same inputs, within 1e-5.

Doc blocks this file runs (the "run" proof of tests/test_docs.py's classification):
- docs/checkpoints.md, the first block (`xmr import-checkpoint --format vse_infty ... --dataset coco --out ...`);
- docs/checkpoints.md "VSE++, precomputed features": `xmr import-checkpoint --format vsepp ...` (not its
  `xmr import-features` line, which needs the COCO annotations);
- docs/checkpoints.md "PVSE (`--format pvse`)": `xmr import-checkpoint --format pvse ...`;
- docs/checkpoints.md "PCME (`--format pcme`)": `xmr import-checkpoint --format pcme ...`;
- README.md's one-line synopsis of `xmr import-checkpoint` (test_readme_synopsis_runs_as_printed).

Fixtures: the reference outputs and recipes are described in tests/fixtures/checkpoints/README.md
("Documented commands"). The ResNet-152 files are written here from the seed rule (seeded.py) in the official
containers: PVSE a bare `module.` state dict in the pre-zip format, PCME `engine.save_models`' dict with float16
tensors and numpy-1 scalars in `metadata['scores']`, both with storages tagged `cuda:0`.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import run_xmr

REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "tests" / "fixtures" / "checkpoints"
DOC = REPO / "docs" / "checkpoints.md"
TOL = 1e-5
sys.path.insert(0, str(FIX))
import py2pickle  # noqa: E402
from command_inputs import CAPTIONS, EXTRA_WORDS, image_files  # noqa: E402
from seeded import WORDS, seeded_tensor  # noqa: E402

COMMAND_WORDS = WORDS + EXTRA_WORDS


def doc_commands(text: str, prefix: str) -> list[str]:
    """Every command line of ``text`` (continuations joined) that starts with ``prefix``."""
    lines = re.sub(r"\\\n\s*", " ", text).splitlines()
    return [ln.strip() for ln in lines if ln.strip().startswith(prefix)]


#: the released file each format's fixture stands for (its --src folder in the doc): a format has several
#: documented lines (VSE∞ region/grid, VSE++ precomputed/full-image), each proved by its own test
DOCUMENTED_SRC = {"vse_infty": "coco_butd_region_bigru/", "vsepp": "runs/coco_vse++/", "pvse": "coco_pvse.pth",
                  "pcme": "pcme_coco.pth"}


def documented_imports(fmt: str | None = None) -> list[list[str]]:
    """Every docs/checkpoints.md `xmr import-checkpoint --format ...` line (of ``fmt``), as argv."""
    return [shlex.split(c) for c in doc_commands(DOC.read_text(), f"xmr import-checkpoint --format {fmt or ''}")]


def documented_import(fmt: str) -> list[str]:
    """The docs/checkpoints.md `xmr import-checkpoint --format FMT` line of the fixture's released file, as argv."""
    found = [a for a in documented_imports(fmt) if a[a.index("--src") + 1].startswith(DOCUMENTED_SRC[fmt])]
    assert len(found) == 1, f"docs/checkpoints.md should print one import line of {DOCUMENTED_SRC[fmt]}: {found}"
    return found[0]


def with_paths(argv: list[str], **paths: Path) -> list[str]:
    """``argv`` with the values of ``--src``/``--vocab``/``--out`` replaced by ``paths`` (nothing else changes)."""
    out = list(argv)
    for name, path in paths.items():
        flag = f"--{name}"
        assert flag in out, f"the documented line has no {flag}: {' '.join(argv)}"
        out[out.index(flag) + 1] = str(path)
    assert [a for a in out if a.startswith("--") and a.lstrip("-") in ("src", "vocab", "out")] == \
        [f"--{n}" for n in ("src", "vocab", "out") if f"--{n}" in argv]
    return out


def run_documented(argv: list[str]) -> None:
    assert argv[:2] == ["xmr", "import-checkpoint"] and "--set" not in argv  # the file decides; no settings by hand
    r = run_xmr(*argv[1:], cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr


def layout_state(layout_json: Path) -> dict[str, torch.Tensor]:
    """A ResNet-152 fixture layout's state by the seed rule, the word embedding sized to the command vocabulary
    (as make_command_io.py builds the reference model)."""
    import json

    state = {}
    for key, shape, dtype in json.loads(layout_json.read_text()):
        if key.endswith("txt_enc.embed.weight"):
            shape = [len(COMMAND_WORDS), shape[1]]
        state[key] = seeded_tensor(key, shape, dtype)
    return state


def assert_close(got, want, what: str) -> None:
    torch.testing.assert_close(torch.as_tensor(got).float(), torch.as_tensor(want).float(), rtol=0, atol=TOL, msg=what)


# -- VSE∞ (BUTD region + BiGRU) and VSE++ (precomputed): captions, and the precomputed image vectors -------------
@pytest.mark.parametrize("fmt,folder,src,vocab", [
    ("vse_infty", "vse_infty", "model_best.pth", "coco_precomp_vocab.json"),
    ("vsepp", "vsepp", "model_best.pth.tar", "coco_precomp_vocab.pkl"),
])
def test_documented_command_reproduces_the_reference(tmp_path, one_thread, fmt, folder, src, vocab):
    import json

    import xmr

    fix = FIX / folder
    out = tmp_path / "runs" / "coco" / f"{fmt}_official"
    run_documented(with_paths(documented_import(fmt), src=fix / src, vocab=fix / vocab, out=out))
    model = xmr.load(out, device="cpu")
    captions = json.loads((fix / "inputs.json").read_text())["captions"]
    images = np.load(fix / "images.npy")
    regions = json.loads((fix / "inputs.json").read_text()).get("regions")
    img = model.encode_image(images, regions)
    txt = model.encode_text(captions)
    assert_close(img, np.load(fix / "expected_img_emb.npy"), "image embeddings")
    assert_close(txt, np.load(fix / "expected_cap_emb.npy"), "caption embeddings")
    assert_close(model.similarity(img, txt), np.load(fix / "expected_sims.npy"), "similarities")


# -- PVSE and PCME: ResNet-152 end to end from image files, nltk tokens of free text ---------------------------
@pytest.fixture(scope="module")
def pvse_run(module_tmp):
    tmp = module_tmp("pvse")
    src = tmp / "coco_pvse.pth"  # DataParallel `module.` copy, pre-zip container, CUDA-tagged storages
    state = {"module." + k: v for k, v in layout_state(FIX / "pvse" / "full_layout.json").items()}
    with py2pickle.cuda_tagged():
        torch.save(state, src, _use_new_zipfile_serialization=False)
    del state
    out = tmp / "runs" / "coco" / "pvse_official"
    run_documented(with_paths(documented_import("pvse"), src=src, vocab=FIX / "pvse" / "command_vocab.pkl", out=out))
    src.unlink()
    return out


@pytest.mark.slow
def test_pvse_documented_command_on_captions_and_image_files(pvse_run, one_thread):
    import xmr

    expected = torch.load(FIX / "pvse" / "command_io.pt", weights_only=True)
    assert expected["captions"] == CAPTIONS
    model = xmr.load(pvse_run, device="cpu")
    assert model.cfg["text"]["tokenizer"] == "nltk" and model.cfg["features"]["source"] == "images"
    txt = model.encode_text(CAPTIONS)
    img = model.encode_image([str(p) for p in image_files()])
    assert_close(txt, expected["txt_emb"], "PVSE caption embeddings (K = 2)")
    assert_close(img, expected["img_emb"], "PVSE image embeddings from the JPEG files")
    assert_close(model.similarity(img, txt), torch.einsum("ikd,jld->ijkl", expected["img_emb"],
                                                          expected["txt_emb"]).flatten(2).amax(-1), "max over K x K")


@pytest.fixture(scope="module")
def pcme_run(module_tmp):
    tmp = module_tmp("pcme")
    tiny = torch.load(FIX / "pcme" / "tiny_coco.pth", weights_only=False)
    half = {k: (v.half() if v.is_floating_point() else v)
            for k, v in layout_state(FIX / "pcme" / "full_layout.json").items()}
    # engine/base.py save_models: metadata['scores'] is the evaluator's dict of numpy float64 (eval_coco.py)
    scores = {"i2t": {"recall_1": np.float64(68.8), "medr": np.float64(1.0), "meanr": np.float64(3.25)},
              "t2i": {"recall_1": np.float64(54.6), "medr": np.float64(1.0), "meanr": np.float64(7.5)},
              "mean_log_image_sigma": np.float64(-3.125), "mean_log_caption_sigma": np.float64(-2.5),
              "rsum": np.float64(491.75)}
    container = {**tiny, "model": half, "config": {**tiny["config"], "model": {**tiny["config"]["model"],
                                                                             "cnn_type": "resnet152"}},
                 "word2idx": {w: i for i, w in enumerate(COMMAND_WORDS)},
                 "metadata": {"cur_epoch": 30, "lr": 2e-6, "scores": scores, "best_score": np.float64(491.75)}}
    src = tmp / "pcme_coco.pth"
    with py2pickle.cuda_tagged():  # a torch 1.x zip file written under numpy 1 from a GPU model
        torch.save(container, src, pickle_module=py2pickle.numpy1)
    assert _zip_has(src, b"numpy.core.multiarray\nscalar")  # numpy 1's name, as the 2021 file
    del container, half
    out = tmp / "runs" / "coco" / "pcme_official"
    run_documented(with_paths(documented_import("pcme"), src=src, out=out))
    src.unlink()
    return out


def _zip_has(path: Path, needle: bytes) -> bool:
    import zipfile

    with zipfile.ZipFile(path) as z:
        return any(needle in z.read(n) for n in z.namelist() if n.endswith("data.pkl"))


@pytest.mark.slow
def test_pcme_documented_command_on_captions_and_image_files(pcme_run, one_thread):
    import json

    import xmr

    expected = torch.load(FIX / "pcme" / "command_io.pt", weights_only=True)
    model = xmr.load(pcme_run, device="cpu")
    assert model.cfg["text"]["tokenizer"] == "nltk" and model.cfg["model"]["num_samples_eval"] == 7
    txt = model.encode_text(CAPTIONS)
    img = model.encode_image([str(p) for p in image_files()])
    # J = 7 samples μ + σ·ε per item, ε the run's fixed test noise (the fixture's, checked in test_checkpoint_pcme)
    assert_close(txt, expected["txt_samples"], "PCME caption samples")
    assert_close(img, expected["img_samples"], "PCME image samples from the JPEG files")
    assert_close(np.exp(model.similarity(img, txt)), expected["match_prob"], "match probability")
    reported = json.loads((pcme_run / "provenance.json").read_text())["reported"]["metadata"]
    assert reported["scores"]["i2t"]["meanr"] == 3.25 and reported["best_score"] == 491.75  # numpy-1 scalars


# -- no settings by hand, and the README synopsis --------------------------------------------------------------
def test_no_documented_import_needs_set():
    """Every documented import line (all formats and variants) runs without --set: the file decides."""
    lines = documented_imports()
    assert {a[a.index("--format") + 1] for a in lines} == {"vse_infty", "vsepp", "pvse", "pcme"}
    for argv in lines:
        assert "--set" not in argv and "--dataset" in argv, " ".join(argv)


def test_readme_synopsis_runs_as_printed(tmp_path, one_thread):
    """README.md's one-line `xmr import-checkpoint` synopsis: its FILE/VOCAB/RUN placeholders are the only
    substitutions."""
    readme = (REPO / "README.md").read_text()
    found = [m for m in re.findall(r"`(xmr import-checkpoint [^`]*)`", readme) if "--format" in m]
    assert found, "README.md prints no `xmr import-checkpoint --format ...` synopsis"
    # `{a,b}`: one of the choices (the first); `[--vocab FILE]`: optional, given (a BiGRU model needs it)
    line = re.sub(r"\{([^{},]+),[^{}]*\}", r"\1", found[0]).replace("[", "").replace("]", "")
    argv = shlex.split(line)
    assert argv[argv.index("--format") + 1] == "vse_infty" and argv[argv.index("--dataset") + 1] == "coco"
    fix = FIX / "vse_infty"
    out = tmp_path / "run"
    run_documented(with_paths(argv, src=fix / "model_best.pth", vocab=fix / "coco_precomp_vocab.json", out=out))
    assert (out / "best.pt").is_file() and (out / "config.yaml").is_file()
