"""The one config loader: YAML (safe_load) with ``extends:`` inheritance and ``key.path=value`` overrides,
validated against JSON schemas before any work starts.

A *run config* (``config/recipes/{dataset}/{recipe}.yaml``) names a method, a dataset and a backbone; the
loader attaches the dataset config (``config/datasets/{name}.yaml``) and the backbone config
(``config/backbones.yaml``) so that every command gets one resolved, validated dict.
"""

from __future__ import annotations

import copy
import os
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

import yaml

from xmr.core.errors import XmrError, shown_path


#: libyaml's safe loader where PyYAML was built with it: the same safe constructors (only the scanner and parser are C),
#: the same documents (checked over every YAML file of the project), about ten times faster: every `xmr` command reads
#: a dozen schema and config files before it starts
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_load(text: str) -> Any:
    """``yaml.safe_load`` with :data:`_SAFE_LOADER`; a malformed text raises the pure-Python parser's error, whose
    message names the token it found and whose line is the one a person looks at."""
    try:
        return yaml.load(text, Loader=_SAFE_LOADER)  # noqa: S506 - a safe loader
    except yaml.YAMLError:
        if _SAFE_LOADER is yaml.SafeLoader:
            raise
        return yaml.safe_load(text)


@lru_cache(maxsize=512)
def _parsed(text: str) -> Any:
    """A YAML text, parsed once per process (keyed by the text itself, never stale): planning a workflow reads the
    same files hundreds of times (the seeded benchmark's 8.7 KB file once per planned job: 868 parses, 18 of the
    28 s of its dry run)."""
    return safe_load(text)


def _mapping(src: str, text: str) -> dict:
    """The parsed mapping of a YAML file's ``text`` (shared: callers copy it before changing it)."""
    try:
        doc = _parsed(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise XmrError(f"{src}: invalid YAML{where}: {getattr(e, 'problem', e)}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise XmrError(f"{src}: expected a mapping at the top level")
    return doc


def _text(path: Path) -> str:
    if not path.exists():
        raise XmrError(f"{shown_path(path)}: config file not found")
    return path.read_text()


def load_yaml(path: str | os.PathLike) -> dict:
    path = Path(path)
    return copy.deepcopy(_mapping(shown_path(path), _text(path)))  # the caller's own: configs are merged and filled in place


def load_validated(path: str | os.PathLike, schema: str) -> dict:
    """``load_yaml(path)`` validated against ``xmr/schemas/{schema}.schema.yaml``, defaults filled. Validated once
    per text in a process: planning the seeded benchmark reads its file once per planned job (868 times)."""
    path = Path(path)
    return copy.deepcopy(_validated(str(path), _text(path), schema))


@lru_cache(maxsize=64)
def _validated(src: str, text: str, schema: str) -> dict:
    return validate(copy.deepcopy(_mapping(src, text)), schema, src)


def deep_merge(base: dict, over: dict) -> dict:
    """Recursive dict merge; ``over`` wins; lists and scalars are replaced, not merged."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _load_with_extends(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    path = path.resolve()
    if path in seen:
        raise XmrError(f"{shown_path(path)}: `extends` cycle")
    doc = load_yaml(path)
    parents = doc.pop("extends", [])
    parents = [parents] if isinstance(parents, str) else parents
    merged: dict = {}
    for p in parents:
        merged = deep_merge(merged, _load_with_extends((path.parent / p), seen + (path,)))
    return deep_merge(merged, doc)


def parse_assignments(items: Iterable[str], option: str = "override", raw: bool = False,
                      form: str = "KEY=VALUE") -> dict[str, Any]:
    """The one ``KEY=VALUE`` parser (``--set``, ``--rerank-param``, experiment overrides): keys in order, values
    parsed as YAML (``0.5`` a number, ``[1, 2]`` a list, ``a.npy`` a string), or kept as strings with ``raw``
    (for a consumer that types them itself). A malformed item is one error naming ``option``."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = str(item).partition("=")
        if not sep or not key.strip():
            raise XmrError(f"{option} {item!r}: expected {form}")
        try:
            out[key.strip()] = value.strip() if raw else safe_load(value)
        except yaml.YAMLError as e:
            raise XmrError(f"{option} {item!r}: the value is not valid YAML ({str(e).splitlines()[0]})") from None
    return out


def apply_overrides(cfg: dict, overrides: Iterable[str]) -> dict:
    """Apply ``a.b.c=value`` overrides (:func:`parse_assignments`) to a copy of ``cfg``."""
    cfg = copy.deepcopy(cfg)
    for key, value in parse_assignments(overrides, "override").items():
        node = cfg
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise XmrError(f"override {key}={value!r}: {p} is not a mapping")
        node[parts[-1]] = value
    return cfg


@lru_cache(maxsize=None)
def load_schema(name: str) -> dict:
    """``xmr/schemas/{name}.schema.yaml`` (parsed once; callers must not modify it)."""
    return safe_load(resources.files("xmr.schemas").joinpath(f"{name}.schema.yaml").read_text())


def method_schema(method: str) -> dict | None:
    """The schema of a built-in method's ``model`` and ``loss`` sections, ``xmr/schemas/methods/{method}.schema.yaml``
    (its class's ``schema``), or None where there is none (a plugin's method carries its schema on its class). Data,
    so that validating a run config (Snakemake's planning) does not import the methods, nor torch."""
    if not resources.files("xmr.schemas").joinpath("methods", f"{method}.schema.yaml").is_file():
        return None
    return load_schema(f"methods/{method}")


def _fmt_path(err) -> str:
    return ".".join(str(p) for p in err.absolute_path) or "<top level>"


def _unknown_keys(err) -> str:
    """'unknown key train.epochz; did you mean: epochs?' for an additionalProperties error: the key and its
    nearest valid names, never the whole schema."""
    import difflib

    allowed = sorted(err.schema.get("properties", {}))
    extra = [k for k in err.instance if k not in allowed]
    prefix = "" if not err.absolute_path else _fmt_path(err) + "."
    parts = []
    for key in extra:
        near = difflib.get_close_matches(str(key), allowed, n=3, cutoff=0.6)
        hint = f"did you mean: {', '.join(near)}?" if near else (
            f"valid keys here: {', '.join(allowed[:12])}{' ...' if len(allowed) > 12 else ''}" if allowed
            else "no keys are allowed here")
        parts.append(f"unknown key '{prefix}{key}'; {hint}")
    return "; ".join(parts) if parts else f"{_fmt_path(err)}: {err.message}"


def validate(cfg: dict, schema: dict | str, source: str) -> dict:
    """Validate ``cfg`` in place, filling schema defaults; raise XmrError naming the first bad key."""
    import jsonschema

    if isinstance(schema, str):
        schema = load_schema(schema)
    base = jsonschema.Draft202012Validator

    def fill_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for prop, sub in properties.items():
                if "default" in sub and prop not in instance:
                    instance[prop] = copy.deepcopy(sub["default"])
        yield from base.VALIDATORS["properties"](validator, properties, instance, schema)

    validator_cls = jsonschema.validators.extend(base, {"properties": fill_defaults})
    errors = sorted(validator_cls(schema).iter_errors(cfg), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        if e.validator == "required":
            missing = e.message.split("'")[1]
            path = _fmt_path(e)
            key = missing if path == "<top level>" else f"{path}.{missing}"
            raise XmrError(f"{source}: missing required key '{key}'")
        if e.validator == "additionalProperties" and isinstance(e.instance, dict):
            raise XmrError(f"{source}: {_unknown_keys(e)}")
        raise XmrError(f"{source}: {_fmt_path(e)}: {e.message}")
    return cfg


def find_config_dir(start: Path) -> Path:
    """The project ``config/`` folder: the nearest ancestor named ``config``, else ``$XMR_CONFIG_DIR`` or ./config."""
    for p in [start, *start.parents]:
        if p.name == "config" and (p / "datasets").is_dir():
            return p
    return Path(os.environ.get("XMR_CONFIG_DIR", "config"))


def load_dataset_config(name_or_path: str, config_dir: str | os.PathLike = "config") -> dict:
    """``config_dir/datasets/NAME.yaml`` (or a YAML file's path), validated; its ``name:`` must be its file's name,
    which is how every command, target and suggested fix finds it again."""
    p = Path(name_or_path)
    if p.suffix not in (".yaml", ".yml"):
        p = Path(config_dir) / "datasets" / f"{name_or_path}.yaml"
    p = Path(shown_path(p))
    if not p.exists():
        avail = sorted(x.stem for x in (Path(config_dir) / "datasets").glob("*.yaml"))
        raise XmrError(f"dataset {name_or_path!r}: no {p}; known datasets: {', '.join(avail) or 'none'}")
    cfg = check_dataset_config(validate(_load_with_extends(p), "dataset", str(p)), str(p))
    if cfg["name"] != p.stem:
        raise XmrError(f"{p}: name: {cfg['name']} differs from the file's name; set name: {p.stem} (or rename the "
                       f"file to {cfg['name']}{p.suffix}, and the recipes' dataset: to {cfg['name']})")
    return cfg


def check_dataset_config(cfg: dict, src: str) -> dict:
    """What the dataset schema cannot say, as one line naming ``src`` and the key: files that a ``source:`` copy
    would have to provide lie under ``root`` (files elsewhere are read where they are, without ``source:``), and a
    ``csv`` table's split comes from exactly one of ``split_column`` or ``split_fractions`` (summing to 1)."""
    if cfg.get("source"):
        if not cfg.get("root"):
            raise XmrError(f"{src}: source: needs root: (the folder its entries are linked into)")
        root = Path(os.path.abspath(cfg["root"]))  # not resolved: root's entries are symlinks into the copy
        for key in ("annotations", "images"):
            path = Path(os.path.abspath(cfg[key])) if cfg.get(key) else None
            if path is not None and not path.is_relative_to(root):
                raise XmrError(f"{src}: {key}: {cfg[key]} is outside root {cfg['root']}, where `source:` links the "
                               f"shared copy; drop `source:` to read the files where they are, or set {key}: under "
                               f"{cfg['root']}/")
    table = cfg.get("csv")
    if cfg["format"] == "csv" and table is not None:
        given = [k for k in ("split_column", "split_fractions") if k in table]
        if len(given) == 2:
            raise XmrError(f"{src}: csv: both split_column and split_fractions are set; keep one of them")
        if not given:
            raise XmrError(f"{src}: csv: no split; set split_column (a column naming each row's split) or "
                           f"split_fractions (e.g. {{train: 0.8, val: 0.1, test: 0.1}})")
        fractions = table.get("split_fractions") or {}
        if fractions and abs(sum(fractions.values()) - 1) > 1e-6:
            raise XmrError(f"{src}: csv.split_fractions: {fractions} sum to {sum(fractions.values()):g}; make them "
                           f"sum to 1")
    return cfg


def load_backbone_config(name: str, config_dir: str | os.PathLike = "config") -> dict:
    path = Path(config_dir) / "backbones.yaml"
    table = load_yaml(path)
    if name not in table:
        raise XmrError(f"{path}: no backbone {name!r}; known: {', '.join(sorted(table))}")
    cfg = validate(dict(table[name]), "backbone", f"{path}:{name}")
    cfg.setdefault("key", name)
    return cfg


def rerank_config_dirs() -> list[Path]:
    """Where ``rerank/<name>.yaml`` is looked up: ``$XMR_CONFIG_DIR``, the repository's config/, ./config."""
    dirs = []
    if os.environ.get("XMR_CONFIG_DIR"):
        dirs.append(Path(os.environ["XMR_CONFIG_DIR"]))
    dirs.append(Path(__file__).resolve().parents[1] / "config")  # the repository's config/ (editable install)
    dirs.append(Path("config"))
    return dirs


def load_rerank_rows(name: str) -> tuple[Path | None, dict]:
    """``(path, rows)`` of ``config/rerank/<name>.yaml`` (per-dataset parameter rows), or ``(None, {})``. Read at
    the edges (CLI, results, report, inference) and passed to :mod:`xmr.rerank` as plain values."""
    for d in rerank_config_dirs():
        p = d / "rerank" / f"{name}.yaml"
        if p.exists():
            return p, load_yaml(p)
    return None, {}


def rerank_params(name: str, dataset: str | None, run_rerank: dict | None = None,
                  given: dict | None = None) -> dict:
    """A re-ranker's parameters by the one precedence every caller uses: ``given`` (command line, API call) over
    the run config's ``eval.rerank.{name}`` (``run_rerank``) over the dataset's row of
    ``config/rerank/<name>.yaml`` over the code's defaults. A reading of a re-ranker (``dsl_val`` of ``dsl``) takes
    its base's rows and its base's section of the run config first (PCME's ``dsl: {scores: log_prob}`` holds for
    ``dsl_val`` too), then its own. Values are as given (``.npy`` paths stay paths: :func:`load_array_params` loads
    them)."""
    from xmr.rerank import default_params, rows_name

    base = rows_name(name)
    run_rerank = run_rerank or {}
    out = default_params(name, dataset, load_rerank_rows(base)[1])
    inherited = dict(run_rerank.get(base, {})) if base != name else {}
    return out | inherited | dict(run_rerank.get(name, {})) | dict(given or {})


def load_array_params(params: dict | None, what: str) -> dict:
    """``params`` with every string value ending in ``.npy`` replaced by the array in that file (re-rankers take
    arrays, e.g. QB-Norm's query bank; the CLI and the workflow pass paths)."""
    import numpy as np

    out = dict(params or {})
    for k, v in out.items():
        if isinstance(v, (str, os.PathLike)) and str(v).endswith(".npy"):
            path = Path(v)
            if not path.exists():
                raise XmrError(f"{what}: {k}={path}: file not found")
            try:
                out[k] = np.load(path)
            except (ValueError, OSError) as e:
                raise XmrError(f"{what}: {k}={path}: not a .npy array ({e})") from None
    return out
