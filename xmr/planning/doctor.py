"""Preflight (``xmr doctor DATASET [TARGET]``): what a target needs, what is missing, and the one command or
download that fixes each piece, before a cluster job finds out.

Checked: the dataset's annotation file(s), the images or the precomputed features of every split the recipe
reads (and, for features that would be extracted, the backbone's weights/config file from
``config/backbones.yaml`` and its optional backend such as detectron2), local word vectors / BERT folders and
the text-feature inputs, and the tracking store. When a cheaper path exists it is named: the SCAN/VSE∞
precomputed download imported by the ``import_scan`` rule instead of BUTD extraction with detectron2.
The workflow runs :func:`workflow_preflight` when it is parsed (also for ``snakemake -n``); it only reports.
Without a target (``xmr doctor DATASET``) it also reads the dataset's train, val and test splits: their sizes, and
the first missing image file of each with the annotation entry that lists it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from xmr.run.layout import result_path
from xmr.core.errors import XmrError

#: backbone family -> (module it needs, how to get it); families not listed need only xmr's requirements
BACKENDS = {"butd_detectron2": ("detectron2", "build detectron2 in its env: `conda env create -f envs/detectron2.yaml`"
                                              " then the pip line in docs/datasets.md 'detectron2'")}
#: dataset formats whose annotation file lists image files (relative to ``images:``, default its own folder)
IMAGE_LIST_FORMATS = ("karpathy", "csv")
#: backbones whose features the SCAN/VSE∞ precomputed download provides (rule import_scan)
SCAN_BACKBONES = ("butd_r101_k36",)
SCAN_DOWNLOAD = ("SCAN's data.zip (Kaggle mirror kuanghueilee/scan-features): {ds}_precomp/ -> data/{ds}/precomp/ "
                 "({splits} x {{_ims.npy, _caps.txt, _ids.txt}})")
KNOWN_DOWNLOADS = {
    "glove.840B.300d.txt": "https://nlp.stanford.edu/data/glove.840B.300d.zip, unzipped into resources/word_vectors/",
    "GoogleNews-vectors-negative300.bin": "GoogleNews-vectors-negative300.bin.gz (word2vec project page; gunzip into"
                                          " resources/word_vectors/)",
    "bua-caffe-frcn-r101-k36.pth": "MILVLG/bottom-up-attention.pytorch README: bua-caffe-frcn-r101-k36.pth into "
                                   "resources/weights/",
    "bua-caffe-frcn-r101-k10-100.pth": "MILVLG/bottom-up-attention.pytorch README: bua-caffe-frcn-r101-k10-100.pth "
                                       "into resources/weights/",
    "test-caffe-r101-fix36.yaml": "MILVLG/bottom-up-attention.pytorch configs/caffe/test-caffe-r101-fix36.yaml "
                                  "into resources/detectron2/",
    "test-caffe-r101.yaml": "MILVLG/bottom-up-attention.pytorch configs/caffe/test-caffe-r101.yaml into "
                            "resources/detectron2/",
}


@dataclass
class Need:
    """One thing a target needs. ``ok``: present (or produced by an earlier rule from what is present)."""

    what: str
    path: str
    ok: bool
    fix: str = ""
    note: str = ""
    by_rule: bool = False  # not there yet, but an earlier rule of the workflow makes it from what is there


@dataclass
class Report:
    dataset: str
    target: str | None
    recipe: str | None = None
    reranker: str | None = None
    needs: list[Need] = field(default_factory=list)
    cheaper: list[str] = field(default_factory=list)

    @property
    def missing(self) -> list[Need]:
        return [n for n in self.needs if not n.ok]

    def add(self, what: str, path: str | os.PathLike, ok: bool, fix: str = "", note: str = "",
            by_rule: bool = False) -> None:
        if not any(n.path == str(path) and n.what == what for n in self.needs):
            self.needs.append(Need(what, str(path), ok, fix, note, by_rule))

    def format(self) -> str:
        head = f"xmr doctor {self.dataset}" + (f" {self.target}" if self.target else "")
        if self.recipe:
            head += f"  (recipe {self.recipe}" + (f", re-ranker {self.reranker})" if self.reranker else ")")
        lines = [head]
        width = max((len(n.what) for n in self.needs), default=0)
        for n in self.needs:
            status = "MISSING" if not n.ok else "by rule" if n.by_rule else "ok"
            lines.append(f"  {status:8} {n.what:{width}}  {n.path}"
                         + (f"  ({n.note})" if n.note else ""))
            if not n.ok and n.fix:
                lines.append(f"  {'':8} {'':{width}}  fix: {n.fix}")
        for c in self.cheaper:
            lines.append(f"  cheaper path: {c}")
        miss = len(self.missing)
        lines.append(f"{miss} missing piece(s); the target cannot run until they are fixed" if miss
                     else "nothing missing")
        return "\n".join(lines)


def _paths(value: Any) -> list[str]:
    if not value:
        return []
    return [value] if isinstance(value, str) else list(value)


def _download_hint(path: str, default: str) -> str:
    return KNOWN_DOWNLOADS.get(Path(path).name, default)


_TARGET_PATH = re.compile(r"(?:.*/)?results/([^/]+)/([^/]+)\.json")


def target_path_dataset(target: str) -> str | None:
    """The dataset of a target path ``results/DATASET/TARGET.json``; None for anything else."""
    m = _TARGET_PATH.fullmatch(target)
    return m.group(1) if m else None


def target_name(dataset: str, target: str) -> str:
    """``results/coco/dvse_fr.json`` or ``dvse_fr`` -> ``dvse_fr`` (checking the dataset matches)."""
    m = _TARGET_PATH.fullmatch(target)
    if m:
        if m.group(1) != dataset:
            raise XmrError(f"target {target} belongs to dataset {m.group(1)!r}, not {dataset!r}")
        return m.group(2)
    if "/" in target or target.endswith(".json"):
        raise XmrError(f"target {target!r}: expected results/{dataset}/RECIPE[_RERANKER].json or RECIPE[_RERANKER]")
    return target


def _check_dataset(rep: Report, ds: dict, need_images: bool) -> None:
    from xmr.data.link import path_under_root

    name = ds["name"]
    source = ds.get("source")
    for ann in _paths(ds.get("annotations")):
        if source and Path(source).is_dir():
            fix = f"`xmr link-dataset --dataset {name}` (source: {source})"
        elif path_under_root(ds, "annotations") is not None:
            fix = (f"{ds.get('obtain', 'see docs/datasets.md')}; or set `source:` in config/datasets/{name}.yaml "
                   f"to a shared copy laid out like {ds['root']}/")
        else:  # read where the config points (outside root, or no root): nothing links it
            fix = (f"{ds.get('obtain', 'put the file there')}; or set `annotations:` in config/datasets/{name}.yaml "
                   f"to where it is")
        rep.add("annotation file", ann, Path(ann).exists(), fix)
    text_dir = (ds.get("extra") or {}).get("text_dir")
    if text_dir:  # CUB: Reed et al.'s captions live apart from the images
        rep.add("captions folder", text_dir, Path(text_dir).is_dir(),
                f"{ds.get('obtain', 'see docs/datasets.md')} (extra.text_dir in config/datasets/{name}.yaml)")
    if ds.get("format") == "cub":
        from xmr.data.cub import resolve_split_settings

        _, rule = resolve_split_settings(ds)
        rep.add("CUB split rule", rule.split(":")[0], True, note=rule.split(": ", 1)[1] + (
            "; PCME's testclasses.txt, trainvalclasses.txt, seen_test_images.txt in the dataset root are followed "
            "when present" if not rule.startswith("split files") else ""))
    if need_images and (ds.get("images") or ds.get("format") in IMAGE_LIST_FORMATS):
        from xmr.data.base import images_folder

        images = images_folder(ds)
        ok = images.is_dir() and any(images.iterdir())
        rep.add("images", images, ok, f"put the image files under {images}/ ({ds.get('obtain', 'docs/datasets.md')})")


def _check_splits(rep: Report, ds: dict, images: bool = True) -> None:
    """Read the splits a recipe trains, validates and tests on, once nothing else of the dataset is missing: their
    sizes and (``images``) their image files. A file the reader refuses (an empty caption, a bad row, too few
    captions) stops here with its one line, as the job that reads it would."""
    from xmr.data.base import images_folder

    annotations = _paths(ds.get("annotations"))
    if not annotations or rep.missing:  # precomputed only (no annotation file), or the files to read are missing
        return
    for split, data in _read_splits(ds):
        rep.add(f"split {split}", annotations[0], True, note=f"{data.num_images} images, {data.num_captions} captions")
        if images and len(data.image_paths) == data.num_images:  # a features-only split lists no image files
            message = data.missing_images_message()
            rep.add(f"image files of split {split}", images_folder(ds), message is None, message or "")


_splits_read: dict[tuple[str, ...], list] = {}


def _read_splits(ds: dict) -> list:
    """(split, its data) of the dataset's train, validation and test splits, read once per process while the
    annotation files are unchanged: the preflight checks every planned target of a dataset."""
    import json

    from xmr.data import load_split

    files = _paths(ds.get("annotations"))
    key = (json.dumps(ds, sort_keys=True, default=str),
           *(f"{f}:{Path(f).stat().st_mtime_ns}" for f in files if Path(f).exists()))
    if key not in _splits_read:
        _splits_read[key] = [(split, load_split(ds, split))
                             for split in dict.fromkeys(["train", ds["val_split"], ds["test_split"]])]
    return _splits_read[key]


def _check_backbone(rep: Report, key: str, config_dir: str | Path) -> None:
    from xmr.config.loader import load_backbone_config

    bb = load_backbone_config(key, config_dir)
    for k in ("weights", "config_file", "detector_weights"):
        if bb.get(k):
            rep.add(f"backbone {key} {k}", bb[k], Path(bb[k]).exists(),
                    f"{_download_hint(bb[k], 'get the file')}; or set `{k}:` of {key} in {config_dir}/backbones.yaml "
                    f"to your copy")
    module, how = BACKENDS.get(bb["name"], (None, ""))
    if module:
        rep.add(f"backend {module}", f"python module {module}", importlib.util.find_spec(module) is not None, how,
                note=f"for backbone {key}")


def _check_precomputed(rep: Report, dataset: str, ds: dict, key: str, split: str, h5: str,
                       config_dir: str | Path) -> None:
    """Features of a precomputed-only backbone: rule import_precomputed runs the entry's import_command on the
    authors' vectors; nothing else can make them."""
    from xmr.config.loader import load_backbone_config
    from xmr.features.backbones.precomputed import import_argv, import_source
    from xmr.features.importers import scan_source_split

    bb = load_backbone_config(key, config_dir)
    command = "xmr " + shlex.join(import_argv(bb, dataset, split, h5))
    src = import_source(bb, dataset, split)
    ims = Path(src or ".") / f"{scan_source_split(ds, split)}_ims.npy"
    if src and ims.exists():
        rep.add(f"features {split}", h5, True, note=f"imported from {ims} by rule import_precomputed", by_rule=True)
        return
    rep.add(f"precomputed features {split}", ims if src else h5, False,
            f"{key} cannot be extracted: get the authors' vectors ({bb.get('description', key)}) into "
            f"{src or 'a folder'}/; rule import_precomputed then runs `{command}`")


def _check_features(rep: Report, dataset: str, ds: dict, info: dict, config_dir: str | Path,
                    cnn_in_checkpoint: bool = False) -> None:
    from xmr.features.importers import scan_source_split
    from xmr.planning.workflow_inputs import image_inputs, precomputed_backbones

    if info["source"] == "images":  # end to end: images + the backbone's weights
        _check_dataset(rep, ds, need_images=True)
        if cnn_in_checkpoint:  # an imported model runs its own CNN: no ImageNet weights file is read
            rep.add(f"backbone {info['backbone']}", "the checkpoint's CNN", True,
                    note="weights from the checkpoint; images through this key's preprocessing")
        else:
            _check_backbone(rep, info["backbone"], config_dir)
        return
    extract_splits = []
    for split, h5 in zip(info["splits"], image_inputs(dataset, info, info["splits"])):
        if Path(h5).exists():
            rep.add(f"features {split}", h5, True)
            continue
        if info["backbone"] in precomputed_backbones(config_dir):  # no extractor: only the authors' vectors
            _check_precomputed(rep, dataset, ds, info["backbone"], split, h5, config_dir)
            continue
        if info["backbone"] in SCAN_BACKBONES:
            src = scan_source_split(ds, split)
            ims = Path(f"data/{dataset}/precomp/{src}_ims.npy")
            if ims.exists() and ims.with_name(f"{src}_caps.txt").exists():
                rep.add(f"features {split}", h5, True, note=f"imported from {ims} by rule import_scan", by_rule=True)
                continue
        rep.add(f"features {split}", h5, True, note="made by the extract rule, which needs what follows",
                by_rule=True)
        extract_splits.append(split)
    if extract_splits:
        _check_dataset(rep, ds, need_images=True)
        _check_backbone(rep, info["backbone"], config_dir)
        if info["backbone"] in SCAN_BACKBONES:
            srcs = sorted({scan_source_split(ds, s) for s in extract_splits})
            rep.cheaper.append(
                "instead of BUTD extraction (detectron2 + weights, GPU hours on the train split) put "
                + SCAN_DOWNLOAD.format(ds=dataset, splits="/".join(srcs))
                + f"; rule import_scan (`xmr import-features --format scan`) then builds "
                  f"{info['dir']}/{dataset}/{info['backbone']}/ and images, detectron2 and the BUTD weights are "
                  f"not needed (docs/datasets.md 'Precomputed features')")


def _check_text(rep: Report, cfg: dict, dataset: str, config_dir: str | Path) -> None:
    text = cfg["text"]
    wv = text.get("word_vectors")
    if isinstance(wv, str) and wv != "glove6b50d":
        rep.add("word vectors", wv, Path(wv).exists(),
                f"{_download_hint(wv, 'get the file')}; or set text.word_vectors in the recipe (glove6b50d is shipped)")
    bert = text.get("bert_path")
    if text.get("encoder") == "bert" and isinstance(bert, str) and ("/" in bert or bert.startswith(".")):
        rep.add("BERT model folder", bert, Path(bert).is_dir(),
                f"`huggingface-cli download {Path(bert).name} --local-dir {bert}` on a connected machine")
    kind = (cfg.get("features") or {}).get("text")
    if text.get("encoder") == "precomputed" and kind:
        from xmr.planning.workflow_inputs import recipe_text_feature_files
        from xmr.text.hglmm import load_text_feature_settings

        files = recipe_text_feature_files(dataset, cfg["name"], config_dir)
        if not all(Path(p).exists() for p in files["train"] + files["score"]):
            wv = load_text_feature_settings(kind, dataset, config_dir)["word_vectors"]
            if wv != "glove6b50d":
                rep.add(f"word vectors ({kind} text features)", wv, Path(wv).exists(),
                        f"{_download_hint(wv, 'get the file')}; or set word_vectors in {config_dir}/text_features.yaml")


def _check_checkpoint(rep: Report, spec: dict) -> None:
    """A recipe that imports a published checkpoint: the official file and its vocabulary, and where the authors
    publish them."""
    published = spec.get("published")  # the recipe names this model's own file
    if not published:  # the format's page (the registry imports torch: only when the recipe names none)
        from xmr.checkpoints import CHECKPOINT_FORMATS

        published = CHECKPOINT_FORMATS.get(spec["format"]).published_at
    where = f"download it from {published}" if published else "download it from the authors' release"
    rep.add(f"checkpoint ({spec['format']})", spec["src"], Path(spec["src"]).is_file(),
            f"{where}; put it at {spec['src']} or set checkpoint.src in the recipe (docs/checkpoints.md)")
    if spec.get("vocab"):
        rep.add("checkpoint vocabulary", spec["vocab"], Path(spec["vocab"]).exists(),
                f"the vocabulary file or tokenizer folder the checkpoint needs "
                f"({published or 'docs/checkpoints.md'}); put it at {spec['vocab']} or set checkpoint.vocab "
                f"in the recipe")


def _check_tracking(rep: Report, cfg: dict | None) -> None:
    if cfg is not None and not cfg["tracking"]["enabled"]:
        return
    from xmr.run.tracking import sqlite_path, tracking_uri

    uri = tracking_uri()
    if importlib.util.find_spec("mlflow") is None:
        rep.add("tracking store", uri, False, "`pip install -r requirements.txt` (mlflow), or tracking.enabled: false")
        return
    db = sqlite_path(uri)
    if db is not None:
        parent = db.parent if str(db.parent) else Path(".")
        ok = parent.is_dir() and os.access(parent, os.W_OK)
        rep.add("tracking store", uri, ok, f"make {parent} writable or set MLFLOW_TRACKING_URI",
                note="exists" if db.exists() else "created on first run")
    else:
        rep.add("tracking store", uri, True, note="server: must be reachable from the compute nodes; not contacted")


def doctor(dataset: str, target: str | None = None, config_dir: str | Path = "config") -> Report:
    """What ``results/{dataset}/{target}.json`` (or, without a target, the dataset) needs and what is missing."""
    from xmr.config.loader import load_dataset_config
    from xmr.run.config import load_run_config
    from xmr.run.layout import parse_target, recipe_path
    from xmr.planning.workflow_inputs import recipe_features

    ds = load_dataset_config(dataset, config_dir)
    rep = Report(dataset, target)
    if ds.get("generate"):  # generated by `xmr synth`: nothing to bring, but the target must name a recipe
        if target is not None:
            rep.recipe, rep.reranker = parse_target(dataset, target_name(dataset, target), config_dir)
        rep.add("dataset", ds["annotations"], True, note="generated by the workflow (rule synth)")
        return rep
    if target is None:
        _check_dataset(rep, ds, need_images=True)
        _check_splits(rep, ds)
        scan = Path(f"data/{dataset}/precomp")
        if scan.is_dir() or (ds.get("extra") or {}).get("scan_splits"):  # the datasets SCAN released features of
            rep.add("SCAN precomputed features", scan, True,
                    note="present" if scan.is_dir() else "optional: replaces BUTD extraction (rule import_scan)")
        _check_tracking(rep, None)
        return rep
    rep.recipe, rep.reranker = parse_target(dataset, target_name(dataset, target), config_dir)
    from xmr.studies.ensembles import is_ensemble, load_ensemble

    if is_ensemble(dataset, rep.recipe, config_dir):  # what each member's run needs
        for member in load_ensemble(dataset, rep.recipe, config_dir).members:
            sub = doctor(dataset, member, config_dir)
            for n in sub.needs:
                rep.add(n.what, n.path, n.ok, n.fix, n.note, n.by_rule)
            rep.cheaper += [c for c in sub.cheaper if c not in rep.cheaper]
        return rep
    cfg = load_run_config(recipe_path(dataset, rep.recipe, config_dir))
    _check_dataset(rep, ds, need_images=False)
    _check_splits(rep, ds, images=False)  # the features may be there already; the captions are read all the same
    info = recipe_features(dataset, rep.recipe, config_dir)
    if cfg.get("checkpoint"):  # imported, not trained: the official file, and only the test split's features
        _check_checkpoint(rep, cfg["checkpoint"])
        info = {**info, "splits": info["splits"][2:]}
    _check_features(rep, dataset, ds, info, config_dir, cnn_in_checkpoint=bool(cfg.get("checkpoint")))
    _check_text(rep, cfg, dataset, config_dir)
    _check_extended_protocols(rep, cfg["eval"].get("protocols") or ds["protocols"], ds)
    _check_tracking(rep, cfg)
    return rep


def _check_extended_protocols(rep: Report, protocols: list[str], ds: dict) -> None:
    """ECCV Caption / CxC (protocols eccv, cxc) read their annotations from the eccv-caption package, and the test
    images' COCO ids from the dataset (``cocoid`` in the Karpathy JSON, SCAN's ``test_ids.txt``)."""
    wanted = [p for p in protocols if p in ("eccv", "cxc")]
    if not wanted:
        return
    from xmr.core.errors import XmrError
    from xmr.data.coco_positives import PACKAGE, package_data

    try:
        where, ok = str(package_data()), True
    except XmrError:
        where, ok = "eccv_caption/data (Python package)", False
    rep.add("ECCV/CxC annotations", where, ok,
            f"pip install {PACKAGE} (pinned in requirements.txt)",
            note=f"protocols {', '.join(wanted)}; the test images' COCO ids come from the {ds['name']} test split "
                 "(cocoid, or SCAN's test_ids.txt)")


def zoo_doctor(config_dir: str | Path = "config") -> list[Report]:
    """:func:`doctor` of every model-zoo target (each recipe with a ``checkpoint:`` section, xmr.studies.zoo): what each
    still needs (the official file, its vocabulary, the test features or images). The ``_fr`` target of a model
    needs the same files."""
    from xmr.studies.zoo import zoo_entries

    return [doctor(e.dataset, e.name, config_dir) for e in zoo_entries(config_dir)]


def format_zoo(reports: list[Report]) -> str:
    """The zoo reports, then one line per target: ready, or the missing pieces by name."""
    lines = [r.format() for r in reports] + ["", "model zoo:"]
    targets = [str(result_path(r.dataset, r.target)) for r in reports]
    width = max(map(len, targets), default=0)
    for r, target in zip(reports, targets):
        needs = "ready" if not r.missing else "needs " + ", ".join(n.what for n in r.missing)
        lines.append(f"  {target:{width}}  {needs}" + (" (or the cheaper path in its report)" if r.cheaper else ""))
    ready = sum(not r.missing for r in reports)
    lines.append(f"{ready} of {len(reports)} zoo targets ready (each also as _fr.json)")
    return "\n".join(lines)


def _targets_by_dataset(targets: Iterable[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for t in targets:
        m = re.fullmatch(r"(?:.*/)?results/([a-z0-9]+)/([a-z0-9_]+)\.json", str(t))
        if m:
            out.setdefault(m.group(1), []).append(m.group(2))
    return out


_checked: set[tuple[str, str]] = set()


def workflow_preflight(workflow: Any, dataset: str, target: str, config_dir: str | Path = "config",
                       stream=None) -> int:
    """Print :func:`doctor`'s report for ``results/{dataset}/{target}.json`` once per Snakemake process, when
    Snakemake plans that target (dry runs included), for datasets that are not generated; the main process
    only, not again inside each job. Missing files are reported, not raised; an XmrError (what the jobs would
    refuse) is raised, and the input function's ``stop_on_xmr_error`` stops Snakemake with its one line. Returns
    the number of missing pieces."""
    if not getattr(workflow, "is_main_process", True) or (dataset, target) in _checked:
        return 0
    _checked.add((dataset, target))
    return preflight_targets([str(result_path(dataset, target))], config_dir, stream)


def preflight_targets(targets: Iterable[str], config_dir: str | Path = "config", stream=None) -> int:
    """Print :func:`doctor`'s report for each ``results/{dataset}/{target}.json`` in ``targets`` whose dataset
    is not generated. Returns the number of missing pieces; raises the XmrError of a dataset or target the jobs
    would refuse (a file the reader refuses, a target naming no recipe), which the workflow prints as its one line
    and stops on."""
    from xmr.config.loader import load_dataset_config

    stream = stream or sys.stderr
    missing = 0
    for dataset, names in _targets_by_dataset(targets).items():
        try:
            if load_dataset_config(dataset, config_dir).get("generate"):
                continue
            for name in names:
                rep = doctor(dataset, name, config_dir)
                missing += len(rep.missing)
                print(rep.format(), file=stream, flush=True)
        except XmrError:  # a file the jobs would refuse (too few captions, a bad row): stop now, with its line
            raise
        except Exception as e:  # anything else must not stop Snakemake from planning
            print(f"xmr doctor {dataset}: could not check ({e})", file=stream, flush=True)
    if missing:
        print(f"xmr doctor: {missing} missing piece(s) above; the jobs that need them will fail "
              f"(`xmr doctor DATASET TARGET` repeats this check)", file=stream, flush=True)
    return missing
