"""``xmr import-checkpoint``: an official checkpoint -> an ordinary xmr run directory.

The run directory holds what a trained run's does for evaluation: ``best.pt`` (``xmr.run.checkpoint_files.BEST_KEYS``,
``weights_only``-loadable), the resolved ``config.yaml``, ``vocab.json`` (BiGRU models) and ``provenance.json``
(source file and its SHA-256, format, options, what the format reported). Everything is built in a temporary
folder beside the output and moved in at the end, so an error leaves no run directory behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import yaml

from xmr.checkpoints.base import CHECKPOINT_FORMATS, ImportedModel, check_state_keys
from xmr.core.errors import XmrError
from xmr.settings.run_settings import ImageInput, run_settings

#: what ``import_checkpoint`` writes into the run directory
RUN_FILES = ("best.pt", "config.yaml", "vocab.json", "provenance.json")


def checkpoint_spec(recipe: str | os.PathLike) -> dict:
    """The ``checkpoint:`` section of a recipe (validated), or an error saying the recipe trains instead."""
    from xmr.run.config import load_run_config

    cfg = load_run_config(recipe)
    if not cfg.get("checkpoint"):
        raise XmrError(f"{recipe}: no checkpoint: section; this recipe is trained (`xmr train`), not imported")
    return cfg["checkpoint"]


def resolve_config(imported: ImportedModel, recipe: str | os.PathLike | None, dataset: str | None,
                   name: str, config_dir: str | os.PathLike = "config", overrides: tuple[str, ...] = (),
                   backbone: str = "", src: str | os.PathLike | None = None) -> dict:
    """The run config: the recipe (or the method's config with ``dataset`` and the format's ``backbone``), the
    overrides, then the sections the checkpoint fixes, validated as any run config."""
    from xmr.run.config import load_run_config
    from xmr.run.layout import method_config_path

    sections = dict(imported.config)
    user_backbone = any(o.startswith("features.backbone=") for o in overrides)
    if user_backbone:  # the user's --set stands over what the format infers (and is size-checked below)
        sections["features"] = {k: v for k, v in sections.get("features", {}).items() if k != "backbone"}
        backbone = ""
    if recipe is None:
        if not dataset:
            raise XmrError("import-checkpoint: give --dataset (e.g. coco) or --recipe")
        sections = {"dataset": dataset, "name": name, **sections}
        if backbone:
            sections["features"] = {"backbone": backbone, **sections.get("features", {})}
        elif not sections.get("features", {}).get("backbone") and not user_backbone:
            raise XmrError(f"import-checkpoint: the {imported.method} checkpoint does not say which image features "
                           f"it reads; give --recipe, or --set features.backbone=KEY (config/backbones.yaml)")
        path = method_config_path(imported.method, config_dir)
    else:
        path = Path(recipe)
        fixed = sections.get("features", {}).get("source")
        given = load_run_config(path, user_set=overrides)["features"]
        if fixed == "images" and given["source"] != "images":
            # e.g. a VSE∞ grid model (its CNN inside) given a region recipe: the file decides, the recipe disagrees
            raise XmrError(f"{src or name}: this model runs its own CNN on image files (features.source: images, "
                           f"backbone {sections['features'].get('backbone')}), but the recipe {path} reads "
                           f"precomputed features ({given.get('backbone')}); give the recipe made for this model "
                           f"(docs/checkpoints.md) or import it without --recipe")
    cfg = load_run_config(path, sections=sections, user_set=overrides)
    if cfg["method"] != imported.method:
        raise XmrError(f"{path}: method {cfg['method']} but the checkpoint is a {imported.method} model")
    check_feature_size(run_settings(cfg).image, imported.image_dim, path)
    return cfg


def backbone_feature_dim(backbone_cfg: dict) -> int | None:
    """The feature size of a config/backbones.yaml entry without building it: its ``feature_dim`` (precomputed-only
    entries), else the fixed size of its backbone class; ``None`` where only building it would tell."""
    from xmr.core.registry import import_submodules
    from xmr.features.backbones import BACKBONES

    if backbone_cfg.get("feature_dim"):
        return int(backbone_cfg["feature_dim"])
    import_submodules("xmr.features.backbones")
    if backbone_cfg.get("name") not in BACKBONES:
        return None
    return int(getattr(BACKBONES.get(backbone_cfg["name"]), "feature_dim", 0) or 0) or None


def check_feature_size(image: ImageInput, image_dim: int | None, where: str | os.PathLike) -> None:
    """The image features the run reads (``features.backbone``) must have the checkpoint's image-layer input size;
    else scoring would fail later with a shape error."""
    dim = backbone_feature_dim(image.backbone_entry or {})
    if image_dim is None or dim is None or dim == int(image_dim):
        return
    key = image.backbone
    raise XmrError(f"features.backbone={key}: its features are {dim}-d but the checkpoint's image layer takes "
                   f"{image_dim}-d inputs ({where}); choose a config/backbones.yaml entry with {image_dim}-d features "
                   f"(--set features.backbone=KEY, or the recipe's features.backbone)")


def folder_digest(folder: Path) -> str:
    """SHA-256 over a model folder's files (names and bytes, sorted by name): what a folder source is."""
    import hashlib

    from xmr.core.io import sha256_file

    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(f"{f.relative_to(folder)}\0{sha256_file(f)}\n".encode())
    return h.hexdigest()


def import_checkpoint(out: str | os.PathLike, fmt: str | None = None, src: str | os.PathLike | None = None,
                      vocab: str | os.PathLike | None = None, recipe: str | os.PathLike | None = None,
                      dataset: str | None = None, options: dict | None = None, overrides: tuple[str, ...] = (),
                      config_dir: str | os.PathLike = "config") -> Path:
    """Convert ``src`` (format ``fmt``) into the run directory ``out``; a recipe's ``checkpoint:`` section gives
    the format, file, vocabulary and options not passed explicitly. Returns ``out``."""
    from xmr.checkpoints.base import plain_data
    from xmr.inference.model import model_from_config
    from xmr.core.io import sha256_file, write_json
    from xmr.run.checkpoint_files import BEST, write_best
    from xmr.core.io import load_checkpoint

    out = Path(out)
    spec = checkpoint_spec(recipe) if recipe is not None else {}
    fmt = fmt or spec.get("format")
    src = src or spec.get("src")
    vocab = vocab or spec.get("vocab")
    options = {**spec.get("options", {}), **(options or {})}
    if not fmt or not src:
        raise XmrError("import-checkpoint: give --format and --src (or --recipe with a checkpoint: section)")
    form = CHECKPOINT_FORMATS.get(fmt)
    src = Path(src)
    if not (src.is_dir() if form.directory else src.is_file()):
        what = "folder" if form.directory else "file"
        raise XmrError(f"{src}: checkpoint {what} not found; download it from {form.published_at or 'the authors'} "
                       f"(docs/checkpoints.md)")
    if vocab is not None and not Path(vocab).exists():
        raise XmrError(f"{vocab}: not found; pass the vocabulary file or tokenizer folder the model was trained "
                       f"with ({form.published_at or 'docs/checkpoints.md'})")
    imported = form.read(src, Path(vocab) if vocab is not None else None, options)
    cfg = resolve_config(imported, recipe, dataset, out.name, config_dir, overrides, form.default_backbone,
                         src)

    # the self-check: xmr's model takes exactly these tensors (strict), before anything is written
    model = model_from_config(cfg, imported.image_dim, imported.vocab_words, pretrained_backbone=False)
    check_state_keys(model.state_dict().keys(), imported.state_dict.keys(), src,
                     f"the {fmt} format does not map this file onto xmr's {imported.method} model")
    expected = model.state_dict()
    bad = [k for k, v in imported.state_dict.items() if tuple(v.shape) != tuple(expected[k].shape)]
    if bad:
        raise XmrError(f"{src}: tensor shapes differ from the model the file describes ({', '.join(bad[:4])}: "
                       f"{tuple(imported.state_dict[bad[0]].shape)} vs {tuple(expected[bad[0]].shape)}); check "
                       f"--format and --option")
    model.load_state_dict(imported.state_dict, strict=True)
    state = {k: v.detach().to(expected[k].dtype).contiguous() for k, v in model.state_dict().items()}
    rsum = imported.provenance.get("best_rsum")
    rsum = float(rsum) if isinstance(rsum, (int, float)) else float("nan")
    provenance = {
        "source": str(src.resolve()), "format": fmt, "options": options,
        "source_sha256": folder_digest(src) if form.directory else sha256_file(src),
        "vocab": None if vocab is None else str(Path(vocab).resolve()),
        "vocab_sha256": None if vocab is None or not Path(vocab).is_file() else sha256_file(vocab),
        "recipe": None if recipe is None else str(recipe), "method": imported.method,
        "reported": plain_data(imported.provenance),
    }

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.import-", dir=out.parent))
    try:
        write_best(tmp / BEST, state, imported.vocab_words, imported.image_dim,
                   int(imported.provenance.get("epoch") or 0), rsum)
        load_checkpoint(tmp / BEST)  # weights_only round trip, as every reader loads it
        (tmp / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        if imported.vocab_words is not None:
            from xmr.text.vocab import Vocabulary

            Vocabulary(imported.vocab_words).save(tmp / "vocab.json")
        write_json(tmp / "provenance.json", provenance)
        out.mkdir(exist_ok=True)
        for name in RUN_FILES:
            if (tmp / name).exists():
                os.replace(tmp / name, out / name)
            elif (out / name).exists():
                (out / name).unlink()  # a stale vocabulary of an earlier import
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
