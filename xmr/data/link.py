"""Put a user's copy of a real dataset where the pipeline reads it: ``data/{dataset}/``.

COCO, Flickr30K and CUB cannot be downloaded by the pipeline (licences, size, and no network on many
clusters). A cluster usually keeps one shared copy; ``source:`` in ``config/datasets/{name}.yaml`` (or
``xmr link-dataset --source DIR``) names it, laid out like ``data/{name}/`` (docs/datasets.md), and each of
its top-level entries is symlinked into the dataset's ``root``. This is also what lets ``snakemake -n`` plan a
real dataset's whole chain: the rule that provides the annotations file runs this. A dataset whose files lie
outside its ``root`` (or that has none) is read where its config points; there is nothing to link.
"""

from __future__ import annotations

import os
from pathlib import Path

from xmr.core.errors import XmrError


def path_under_root(ds_cfg: dict, key: str) -> Path | None:
    """``ds_cfg[key]`` relative to the dataset's ``root``; None when there is no root or the file lies outside it
    (read where it is: nothing to link)."""
    if not ds_cfg.get("root") or not ds_cfg.get(key):
        return None
    root, path = Path(os.path.abspath(ds_cfg["root"])), Path(os.path.abspath(ds_cfg[key]))
    return path.relative_to(root) if path.is_relative_to(root) else None


def link_dataset(ds_cfg: dict, source: str | os.PathLike | None = None) -> list[Path]:
    """Symlink the entries of ``source`` (default: the config's ``source:``) into ``ds_cfg['root']``; return
    the links made. Entries that already exist in ``root`` are kept (an empty folder, as Snakemake creates for
    an output's parent, is replaced). Raises :class:`XmrError` naming the missing file and how to get it."""
    name = ds_cfg["name"]
    annotations = Path(ds_cfg["annotations"])
    src = source if source is not None else ds_cfg.get("source")
    wanted = path_under_root(ds_cfg, "annotations")
    if src is not None and wanted is None:
        raise XmrError(f"dataset {name}: annotations: {annotations} is not under root {ds_cfg.get('root')}, where a "
                       f"source folder is linked; set annotations: under root, or drop the source to read the file "
                       f"where it is")
    if src is None:
        if annotations.exists():
            return []
        obtain = ds_cfg.get("obtain", f"put it there or set `annotations:` in config/datasets/{name}.yaml")
        if wanted is None:  # no root, or a file outside it: read where it is, never linked
            raise XmrError(f"{annotations}: not found; {obtain} (docs/datasets.md)")
        raise XmrError(f"{annotations}: not found; {obtain}, or set `source:` in config/datasets/{name}.yaml to a "
                       f"folder laid out like {ds_cfg['root']}/ (docs/datasets.md)")
    src = Path(src).expanduser()
    if not src.is_dir():
        raise XmrError(f"dataset {name}: source {src}: not a folder; set `source:` in config/datasets/{name}.yaml "
                       f"to the folder holding {wanted}")
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
    """Dataset name -> annotations path relative to its root, for every real (not generated) dataset config whose
    annotations lie under its root: the files the Snakemake rule ``link_dataset`` provides. Read when the
    workflow is parsed, so a config that does not load is left out here: its error comes when one of its targets
    is asked for (:func:`xmr.planning.workflow_inputs.requested_target_error`), not for every target."""
    from xmr.config.loader import load_dataset_config

    out = {}
    for path in sorted((Path(config_dir) / "datasets").glob("*.yaml")):
        try:
            cfg = load_dataset_config(str(path), config_dir)
        except XmrError:
            continue
        wanted = None if "generate" in cfg else path_under_root(cfg, "annotations")
        if wanted is not None:
            out[cfg["name"]] = str(wanted)
    return out


def link_rule_constraints(config_dir: str | os.PathLike = "config") -> dict[str, str]:
    """Wildcard regexes (``dataset``, ``annotations``) of rule ``link_dataset``: only real datasets' annotation
    files match, so generated data (synth), features and precomputed imports never do."""
    import re

    table = linkable_annotations(config_dir)
    never = "(?!)"  # matches nothing: no real dataset configured
    return {"dataset": "|".join(map(re.escape, table)) or never,
            "annotations": "|".join(sorted(map(re.escape, set(table.values())))) or never}
