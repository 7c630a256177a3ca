"""Report settings: ``config/report.yaml`` (schema ``xmr/schemas/report.schema.yaml``), ``default`` merged with
``datasets.{name}``. ``BASE`` only fills keys a partial file leaves out; the project's values live in the file."""

from __future__ import annotations

import os
from pathlib import Path

from xmr.config import deep_merge, load_yaml, validate

BASE = {
    "methods": None,
    "rerank": ["none"],
    "experiments": [],
    "fr_grid": {"recipes": [], "split": "val", "gammas": [5, 10, 20, 25, 50], "lambdas": [5, 10, 20, 25, 50]},
    "examples": {"recipe": None, "queries": 1, "top_k": 5, "seed": 0},
    "subembeddings": {"recipes": [], "images": 1, "seed": 0},
    "readme": [],
    "curves": True,
    "mlflow": True,
}


def report_settings(dataset: str, config_dir: str | os.PathLike = "config") -> dict:
    """Settings of the report of ``dataset`` (``BASE`` < file ``default`` < file ``datasets.{dataset}``)."""
    path = Path(config_dir) / "report.yaml"
    if not path.exists():
        return deep_merge(BASE, {})
    doc = validate(load_yaml(path), "report", str(path))
    return deep_merge(deep_merge(BASE, doc["default"]), (doc.get("datasets") or {}).get(dataset, {}))


def report_methods(dataset: str, settings: dict, config_dir: str | os.PathLike = "config") -> list[str]:
    """Recipes of the report, in table order: the settings' list, else every recipe file of the dataset."""
    recipes = Path(config_dir) / "recipes" / dataset
    if settings["methods"] is not None:
        return list(settings["methods"])
    return sorted(p.stem for p in recipes.glob("*.yaml"))


def readme_parts(dataset: str, settings: dict) -> list[str]:
    """The generated Markdown files README.md shows for ``dataset`` (section ``results-{dataset}``)."""
    return [p.format(dataset=dataset) for p in settings["readme"]]


__all__ = ["report_settings", "report_methods", "readme_parts", "BASE"]
