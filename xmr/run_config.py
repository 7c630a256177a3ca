"""The run config: a recipe (``extends:`` resolved, ``--set`` overrides applied) validated against the run schema
and then against its method's own schema, where the methods are registered (so the generic YAML machinery of
:mod:`xmr.config` never imports the methods), with its dataset and backbone configs attached."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

import copy
from functools import lru_cache

from xmr.config import (_load_with_extends, apply_overrides, deep_merge, find_config_dir, load_backbone_config,
                        load_dataset_config, load_schema, validate)
from xmr.errors import XmrError
from xmr.methods import METHODS


def run_schema() -> dict:
    """The run schema with its name lists filled from the registries: ``text.encoder`` (text encoders) and
    ``eval.similarity`` (similarity measures, plus ``model``: the method's own). A name registered later (a
    plugin) is in the next call's schema."""
    from xmr.models.text import TEXT_ENCODERS
    from xmr.similarity import SIMILARITIES

    return _run_schema(tuple(TEXT_ENCODERS.names()), (*SIMILARITIES.names(), "model"))


@lru_cache(maxsize=8)
def _run_schema(encoders: tuple[str, ...], similarities: tuple[str, ...]) -> dict:
    schema = copy.deepcopy(load_schema("run"))
    props = schema["properties"]
    props["text"]["properties"]["encoder"]["enum"] = list(encoders)
    props["eval"]["properties"]["similarity"]["enum"] = list(similarities)
    return schema


def load_run_config(path: str | os.PathLike, overrides: Iterable[str] = (), sections: dict | None = None) -> dict:
    """Load, resolve and validate a run config; attaches ``dataset_cfg`` and ``backbone_cfg``. ``sections``
    (nested dict, e.g. what an imported checkpoint fixes) are merged over the file and the overrides before
    validation."""
    path = Path(path)
    cfg = apply_overrides(_load_with_extends(path), overrides)
    if sections:
        cfg = deep_merge(cfg, sections)
    cfg.setdefault("name", path.stem)
    src = str(path)
    validate(cfg, run_schema(), src)
    if cfg["method"] not in METHODS:
        raise XmrError(f"{src}: method: unknown method {cfg['method']!r}; choose one of: "
                       f"{', '.join(METHODS.names())}")
    method = METHODS.get(cfg["method"])
    validate(cfg, method.schema, src)
    config_dir = find_config_dir(path.resolve().parent)
    cfg["dataset_cfg"] = load_dataset_config(cfg["dataset"], config_dir)
    if cfg.get("features", {}).get("backbone"):
        cfg["backbone_cfg"] = load_backbone_config(cfg["features"]["backbone"], config_dir)
    return cfg
