"""The run config: from a recipe (:func:`load_run_config`) or from a run directory (:func:`load_saved_config`).

A recipe (``extends:`` resolved, ``--set`` overrides applied) validated against the run schema
and then against its method's own schema (a built-in method's is a file, :func:`xmr.config.loader.method_schema`, so
that validating imports neither the methods nor torch; a plugin's is looked up in the registry), with its dataset and
backbone configs attached."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

import copy
from functools import lru_cache

from xmr.config.loader import (_load_with_extends, apply_overrides, parse_assignments, deep_merge, find_config_dir,
                               load_backbone_config, load_dataset_config, load_schema, load_yaml, method_schema,
                               validate)
from xmr.core.errors import XmrError
from xmr.core.registry import PLUGINS_ENV


def run_schema() -> dict:
    """The run schema. Its name lists, ``text.encoder`` (text encoders), ``eval.similarity`` (similarity
    measures, plus ``model``: the method's own) and ``checkpoint.format`` (the checkpoint formats), are written
    in the schema, so that validating a run config imports no torch; with ``$XMR_PLUGINS`` set the first two are
    read from the registries, plugins' entries included (a name registered later is in the next call's schema)."""
    if not os.environ.get(PLUGINS_ENV, "").strip():
        return load_schema("run")
    import xmr.methods  # noqa: F401 - imports the plugins, which may register text encoders and measures
    from xmr.models.text import TEXT_ENCODERS
    from xmr.similarity.measures import SIMILARITIES

    return _run_schema(tuple(TEXT_ENCODERS.names()), (*SIMILARITIES.names(), "model"))


@lru_cache(maxsize=8)
def _run_schema(encoders: tuple[str, ...], similarities: tuple[str, ...]) -> dict:
    schema = copy.deepcopy(load_schema("run"))
    props = schema["properties"]
    props["text"]["properties"]["encoder"]["enum"] = list(encoders)
    props["eval"]["properties"]["similarity"]["enum"] = list(similarities)
    return schema


#: keys that no longer exist, each with why: a recipe that sets one is an error (it never did what it says); a saved
#: run's config.yaml drops it (the model it describes was built without it)
RETIRED_KEYS: dict[tuple[str, str], str] = {
    ("text", "hidden_dim"): "it never set anything: the BiGRU's width is model.embed_dim (as in VSE++ and VSE∞)",
}


def _retired(cfg: dict) -> list[tuple[str, str]]:
    return [(sec, key) for sec, key in RETIRED_KEYS if isinstance(cfg.get(sec), dict) and key in cfg[sec]]


def _validate_run(cfg: dict, src: str) -> dict:
    """``cfg`` validated (defaults filled) against the run schema and then its method's schema."""
    validate(cfg, run_schema(), src)
    schema = method_schema(cfg["method"])
    if schema is None:  # not a built-in: a plugin's method (whose module imports torch), or a misspelt name
        from xmr.methods import METHODS

        if cfg["method"] not in METHODS:
            raise XmrError(f"{src}: method: unknown method {cfg['method']!r}; choose one of: "
                           f"{', '.join(METHODS.names())}")
        schema = METHODS.get(cfg["method"]).schema
    return validate(cfg, schema, src)


def load_run_config(path: str | os.PathLike, overrides: Iterable[str] = (), sections: dict | None = None,
                    user_set: Iterable[str] = ()) -> dict:
    """Load, resolve and validate a run config; attaches ``dataset_cfg`` and ``backbone_cfg``. ``sections``
    (nested dict, e.g. what an imported checkpoint fixes) are merged over the file and the overrides before
    validation. ``user_set``: the command line's ``--set KEY.PATH=VALUE`` items, applied last; a key or value
    of theirs that the schemas refuse is an error naming ``--set`` and the item, not the recipe file."""
    path = Path(path)
    user_set = list(user_set)
    base = apply_overrides(_load_with_extends(path), overrides)
    if sections:
        base = deep_merge(base, sections)
    base.setdefault("name", path.stem)
    cfg = apply_overrides(base, user_set)
    if sections:  # what the checkpoint fixes stands over --set too
        cfg = deep_merge(cfg, sections)
    if retired := _retired(cfg):
        sec, key = retired[0]
        raise XmrError(f"{path}: {sec}.{key}: not a setting any more ({RETIRED_KEYS[sec, key]}); remove it from the "
                       f"recipe (or the file it extends) and from --set")
    try:
        _validate_run(cfg, str(path))
    except XmrError:
        if user_set:
            _blame_user_set(base, user_set, sections, str(path))
        raise
    config_dir = find_config_dir(path.resolve().parent)
    cfg["dataset_cfg"] = load_dataset_config(cfg["dataset"], config_dir)
    if cfg.get("features", {}).get("backbone"):
        cfg["backbone_cfg"] = load_backbone_config(cfg["features"]["backbone"], config_dir)
    return cfg


def _blame_user_set(base: dict, user_set: list[str], sections: dict | None, src: str) -> None:
    """Raise the validation error of the first ``--set`` item that makes ``base`` invalid, as ``--set ITEM: ...``;
    return when ``base`` is invalid without them (then the recipe's own error stands)."""
    try:
        _validate_run(copy.deepcopy(base), src)
    except XmrError:
        return
    for n, item in enumerate(user_set, 1):
        cfg = apply_overrides(base, user_set[:n])
        try:
            _validate_run(deep_merge(cfg, sections) if sections else cfg, src)
        except XmrError as e:
            raise XmrError(f"--set {item}: {str(e).removeprefix(f'{src}: ')}") from None


# -- saved runs ------------------------------------------------------------------------------------------------

#: the resolved config a run directory holds (written by the trainer and by ``xmr import-checkpoint``)
SAVED_CONFIG = "config.yaml"


def load_saved_config(run_dir: str | os.PathLike) -> dict:
    """The resolved config of a run directory, as today's version reads it: ``config.yaml`` re-validated against
    today's run, method, dataset and backbone schemas, so that a key added since the run was written gets its
    default (a run directory outlives the version that wrote it). The one reader of a saved ``config.yaml``."""
    path = Path(run_dir) / SAVED_CONFIG
    if not path.is_file():
        raise XmrError(f"{path}: not found; {run_dir} is not a run directory (train it with `xmr train`, or "
                       f"import one with `xmr import-checkpoint`)")
    cfg = load_yaml(path)
    if not isinstance(cfg, dict):
        raise XmrError(f"{path}: not a run config (a mapping of sections); was it written by `xmr train`?")
    dataset_cfg, backbone_cfg = cfg.pop("dataset_cfg", None), cfg.pop("backbone_cfg", None)
    if not isinstance(dataset_cfg, dict):
        raise XmrError(f"{path}: no dataset_cfg section; a run directory's config.yaml holds its resolved dataset "
                       f"config (rerun `xmr train` or `xmr import-checkpoint` for it)")
    for sec, key in _retired(cfg):
        del cfg[sec][key]
    _validate_run(cfg, str(path))
    cfg["dataset_cfg"] = validate(dataset_cfg, "dataset", f"{path}: dataset_cfg")
    if backbone_cfg is not None:
        cfg["backbone_cfg"] = validate(backbone_cfg, "backbone", f"{path}: backbone_cfg")
    return cfg


def on_dataset(cfg: dict, dataset: str | None) -> dict:
    """The resolved run config ``cfg`` pointed at another dataset's splits (``xmr score``/``xmr test --dataset``):
    ``dataset`` is a name (``config/datasets/NAME.yaml``, from ``$XMR_CONFIG_DIR`` or ./config) or a YAML path. The
    model, vocabulary and feature folder stay the run's; the images' features are read from
    ``{features.dir}/{dataset}/{backbone}/``, the protocols are the dataset's own (a recipe's ``eval.protocols`` name
    its training dataset's). ``None`` or the run's own dataset's name: ``cfg`` unchanged (its saved dataset)."""
    if dataset is None or dataset == cfg["dataset"]:
        return cfg
    other = load_dataset_config(dataset, find_config_dir(Path.cwd()))
    if other["name"] == cfg["dataset"]:
        if other != cfg["dataset_cfg"]:
            raise XmrError(f"{dataset}: names the run's own dataset {other['name']!r} with other settings than the "
                           f"run was trained with; give it a name of its own (name: and the file's name)")
        return cfg
    return {**cfg, "dataset": other["name"], "dataset_cfg": other, "eval": {**cfg["eval"], "protocols": []}}


def command_line_epochs(cfg: dict, overrides: list[str]) -> str | None:
    """``--set train.epochs=N`` on a run whose stopping rule caps epochs with ``early_stopping.max_epochs``: the
    setting wins (the user asked for N epochs; the rule may still stop earlier), so the cap becomes N, in ``cfg``
    and hence in the run's config.yaml. Returns the one line that says so (None when nothing changed)."""
    keys = parse_assignments(overrides, "--set")
    es = cfg["train"]["early_stopping"]
    if "train.epochs" not in keys or "train.early_stopping.max_epochs" in keys or not es["enabled"] \
            or not es["max_epochs"] or es["max_epochs"] == cfg["train"]["epochs"]:
        return None
    before, es["max_epochs"] = es["max_epochs"], cfg["train"]["epochs"]
    return (f"--set train.epochs={cfg['train']['epochs']}: the stopping rule's cap follows it "
            f"(train.early_stopping.max_epochs {before} -> {es['max_epochs']}; the rule may still stop earlier)")
