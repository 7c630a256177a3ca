"""One source of defaults: the Python/JSON schemas. config/methods/*.yaml holds only the settings that differ
from them, and no default is written twice with two values."""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import pytest
import yaml

from xmr.config.loader import deep_merge, load_schema, validate
from xmr.core.errors import XmrError
from xmr.methods import METHODS

REPO = Path(__file__).resolve().parents[1]
METHOD_YAMLS = sorted((REPO / "config" / "methods").glob("*.yaml"))


def resolve(doc: dict) -> dict:
    """A method file as the loader resolves it (run schema, then the method's schema, defaults filled)."""
    cfg = deep_merge({"features": {}}, deep_merge(doc, {"dataset": "synth"}))
    validate(cfg, "run", "method file")
    validate(cfg, METHODS.get(cfg["method"]).schema, "method file")
    return cfg


def leaf_paths(d: dict, prefix: tuple = ()) -> list[tuple]:
    out = []
    for k, v in d.items():
        out += leaf_paths(v, prefix + (k,)) if isinstance(v, dict) and v else [prefix + (k,)]
    return out


def without(doc: dict, path: tuple) -> dict:
    doc = copy.deepcopy(doc)
    node = doc
    for k in path[:-1]:
        node = node[k]
    del node[path[-1]]
    return doc


def restated_defaults(doc: dict) -> list[str]:
    """Keys whose removal leaves the resolved config unchanged (they repeat what the schema already says)."""
    full = resolve(doc)
    out = []
    for path in leaf_paths(doc):
        if path == ("method",):
            continue
        try:
            same = resolve(without(doc, path)) == full
        except XmrError:  # a required key (model.embed_dim, a required section): not a default
            same = False
        if same:
            out.append(".".join(path))
    return out


def test_the_check_catches_a_restated_default():
    doc = yaml.safe_load((REPO / "config" / "methods" / "vsepp.yaml").read_text())
    doc.setdefault("optim", {})["momentum"] = 0.9  # the run schema's default
    doc["loss"]["margin"] = 0.2  # VSE++'s schema default
    assert set(restated_defaults(doc)) == {"optim.momentum", "loss.margin"}


@pytest.mark.parametrize("path", METHOD_YAMLS, ids=lambda p: p.stem)
def test_method_yaml_restates_no_default(path):
    doc = yaml.safe_load(path.read_text())
    assert doc["method"] == path.stem
    assert restated_defaults(doc) == [], f"{path.name}: these keys repeat the schema default; delete them"


def schema_defaults(schema: dict, prefix: tuple = ()) -> dict[tuple, object]:
    out = {}
    for k, sub in schema.get("properties", {}).items():
        if "default" in sub and sub["default"] != {}:
            out[prefix + (k,)] = sub["default"]
        out.update(schema_defaults(sub, prefix + (k,)))
    return out


def test_run_schema_and_method_schemas_agree_on_shared_defaults():
    run = schema_defaults(load_schema("run"))
    assert run[("optim", "lr")] == 0.0002  # the walker reads nested defaults
    for name, cls in METHODS.items():
        for path, value in schema_defaults(cls.schema).items():
            if path in run:
                assert value == run[path], f"{'.'.join(path)}: run schema {run[path]!r}, {name} schema {value!r}"


def _code_fallbacks() -> list[tuple[str, int, str, object]]:
    """``section.get("key", literal)`` in the model code: a second place a default can be written."""
    out = []
    for sub in ("methods", "models", "losses", "train"):
        for f in sorted((REPO / "xmr" / sub).glob("*.py")):
            for node in ast.walk(ast.parse(f.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                        and len(node.args) == 2 and isinstance(node.args[0], ast.Constant)
                        and isinstance(node.args[0].value, str)):
                    try:
                        value = ast.literal_eval(node.args[1])
                    except ValueError:
                        continue
                    if not isinstance(value, dict):  # .get("text", {}) reaches a section, not a value
                        out.append((f"{sub}/{f.name}", node.lineno, node.args[0].value, value))
    return out


def test_code_fallbacks_equal_the_schema_default():
    """Where code falls back to a default for a config key, it is the schema's (keys with one default only)."""
    by_key: dict[str, set] = {}
    for schema in [load_schema("run")] + [cls.schema for _, cls in METHODS.items()]:
        for path, value in schema_defaults(schema).items():
            by_key.setdefault(path[-1], set()).add(repr(value))
    fallbacks = _code_fallbacks()
    assert any(key == "max_len" for _, _, key, _ in fallbacks)  # the scan finds the text encoders' fallbacks
    bad = [f"{where}:{line}: {key} falls back to {value!r}, the schema says {by_key[key]}"
           for where, line, key, value in fallbacks
           if key in by_key and len(by_key[key]) == 1 and repr(value) not in by_key[key]]
    assert bad == []


RERANK_ROWS = sorted((REPO / "config" / "rerank").glob("*.yaml"))


@pytest.mark.parametrize("path", RERANK_ROWS, ids=lambda p: p.stem)
def test_rerank_rows_restate_no_code_default(path):
    """config/rerank/{name}.yaml holds only the per-dataset values that differ from the re-ranker's code defaults
    (and, for a dataset row, from the file's `default` row)."""
    from xmr.rerank import RERANKERS

    defaults = dict(RERANKERS.get(path.stem).defaults)
    rows = yaml.safe_load(path.read_text()) or {}
    base = {**defaults, **(rows.get("default") or {})}
    restated = [f"{row}.{k}" for row, values in rows.items() for k, v in (values or {}).items()
                if v == (defaults if row == "default" else base).get(k)]
    assert restated == [], f"{path.name}: these values repeat a default; delete them"


RECIPES = sorted((REPO / "config" / "recipes").glob("*/*.yaml"))
RECIPE_KEEP = {"extends", "paper", "dataset", "method", "name", "description", "checkpoint"}


def mirror_config(folder: Path) -> Path:
    """``folder/config``: every entry of the repository's config/ linked but an empty recipes/. A recipe copied into
    its recipes/DATASET/ resolves its dataset and backbone as the original does, and nothing is written into the
    repository, whose config/ other test workers list meanwhile (the model zoo, the YAML and wording checks)."""
    cfg = folder / "config"
    (cfg / "recipes").mkdir(parents=True)
    for entry in (REPO / "config").iterdir():
        if entry.name != "recipes":
            (cfg / entry.name).symlink_to(entry)
    return cfg


def restated_in_recipe(path: Path) -> list[str]:
    """Keys of a recipe whose removal leaves its resolved run config unchanged: they repeat the method file it
    extends or a schema default (a recipe holds only what its paper setting changes)."""
    import json
    import tempfile

    from xmr.run.config import load_run_config

    doc = yaml.safe_load(path.read_text())
    full = json.dumps(load_run_config(path), sort_keys=True, default=str)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        copy_path = mirror_config(Path(tmp)) / "recipes" / path.parent.name / path.name
        copy_path.parent.mkdir()
        for key in leaf_paths(doc):
            if key[0] in RECIPE_KEEP:
                continue
            trimmed = without(doc, key)
            if "extends" in trimmed:  # the copy lives elsewhere: point at the same base file
                trimmed["extends"] = str((path.parent / trimmed["extends"]).resolve())
            copy_path.write_text(yaml.safe_dump(trimmed, sort_keys=False))
            try:
                same = json.dumps(load_run_config(copy_path), sort_keys=True, default=str) == full
            except XmrError:
                same = False
            if same:
                out.append(".".join(map(str, key)))
    return out


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_recipe_restates_nothing(path):
    assert restated_in_recipe(path) == [], f"{path}: these keys repeat the method file or a schema default"


def test_the_recipe_check_catches_a_restated_key(tmp_path):
    recipe = REPO / "config" / "recipes" / "synth" / "vsepp.yaml"
    doc = yaml.safe_load(recipe.read_text())
    doc["loss"] = {"margin": 0.2}              # what config/methods/vsepp.yaml already says
    doc["train"]["batch_size"] = 128          # the run schema's default
    probe = mirror_config(tmp_path) / "recipes" / "synth" / "restated_probe.yaml"
    probe.parent.mkdir()
    probe.write_text(yaml.safe_dump(doc, sort_keys=False))  # its relative `extends` reaches config/methods/ there
    assert set(restated_in_recipe(probe)) == {"loss.margin", "train.batch_size"}
