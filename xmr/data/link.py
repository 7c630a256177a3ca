"""Put a user's copy of a real dataset where the pipeline reads it: ``data/{dataset}/``.

COCO, Flickr30K and CUB cannot be downloaded by the pipeline (licences, size, and no network on many
clusters). A cluster usually keeps one shared copy; ``source:`` in ``config/datasets/{name}.yaml`` (or
``xmr link-dataset --source DIR``) names it, laid out like ``data/{name}/`` (docs/datasets.md), and each of
its top-level entries is symlinked into the dataset's ``root``. This is also what lets ``snakemake -n`` plan a
real dataset's whole chain: the rule that provides the annotations file runs this.
"""

from __future__ import annotations

import os
from pathlib import Path

from xmr.errors import XmrError


def _relative_to_root(ds_cfg: dict, key: str) -> Path:
    root, path = Path(ds_cfg["root"]), Path(ds_cfg[key])
    try:
        return path.relative_to(root)
    except ValueError:
        raise XmrError(f"dataset {ds_cfg['name']}: {key}: {path} is not under root {root}; "
                       f"link it yourself or move `root`") from None


def link_dataset(ds_cfg: dict, source: str | os.PathLike | None = None) -> list[Path]:
    """Symlink the entries of ``source`` (default: the config's ``source:``) into ``ds_cfg['root']``; return
    the links made. Entries that already exist in ``root`` are kept (an empty folder, as Snakemake creates for
    an output's parent, is replaced). Raises :class:`XmrError` naming the missing file and how to get it."""
    name = ds_cfg["name"]
    annotations = Path(ds_cfg["annotations"])
    src = source if source is not None else ds_cfg.get("source")
    if src is None:
        if annotations.exists():
            return []
        raise XmrError(f"{annotations}: not found; {ds_cfg.get('obtain', 'place the dataset under ' + ds_cfg['root'])}"
                       f", or set `source:` in config/datasets/{name}.yaml to a folder laid out like "
                       f"{ds_cfg['root']}/ (docs/datasets.md)")
    src = Path(src).expanduser()
    if not src.is_dir():
        raise XmrError(f"dataset {name}: source {src}: not a folder; set `source:` in config/datasets/{name}.yaml "
                       f"to the folder holding {annotations.relative_to(ds_cfg['root'])}")
    wanted = _relative_to_root(ds_cfg, "annotations")
    if not (src / wanted).exists():
        raise XmrError(f"dataset {name}: {src / wanted}: not found in the source folder; "
                       f"{ds_cfg.get('obtain', 'see docs/datasets.md')}")
    root = Path(ds_cfg["root"])
    root.mkdir(parents=True, exist_ok=True)
    made = []
    for entry in sorted(src.iterdir()):
        dest = root / entry.name
        if dest.is_dir() and not dest.is_symlink() and not any(dest.iterdir()):
            dest.rmdir()
        if dest.exists() or dest.is_symlink():
            continue
        dest.symlink_to(entry.resolve(), target_is_directory=entry.is_dir())
        made.append(dest)
    if not annotations.exists():
        raise XmrError(f"{annotations}: still missing after linking {src} into {root}; an entry of that name "
                       f"already exists in {root}: remove it or fix it")
    return made


def linkable_annotations(config_dir: str | os.PathLike = "config") -> dict[str, str]:
    """Dataset name -> annotations path relative to its root, for every real (not generated) dataset config:
    the files the Snakemake rule ``link_dataset`` provides."""
    from xmr.config import load_dataset_config

    out = {}
    for path in sorted((Path(config_dir) / "datasets").glob("*.yaml")):
        cfg = load_dataset_config(str(path), config_dir)
        if "generate" in cfg or "annotations" not in cfg or "root" not in cfg:
            continue
        out[cfg["name"]] = str(_relative_to_root(cfg, "annotations"))
    return out


def link_rule_constraints(config_dir: str | os.PathLike = "config") -> dict[str, str]:
    """Wildcard regexes (``dataset``, ``annotations``) of rule ``link_dataset``: only real datasets' annotation
    files match, so generated data (synth), features and precomputed imports never do."""
    import re

    table = linkable_annotations(config_dir)
    never = "(?!)"  # matches nothing: no real dataset configured
    return {"dataset": "|".join(map(re.escape, table)) or never,
            "annotations": "|".join(sorted(map(re.escape, set(table.values())))) or never}
