"""Report settings: ``config/report.yaml`` (schema ``xmr/schemas/report.schema.yaml``), ``default`` merged with
``datasets.{name}``. Every setting is written once, in the file's ``default`` (the schema requires each key)."""

from __future__ import annotations

import os
from pathlib import Path

from xmr.config.loader import deep_merge, load_validated
from xmr.core.errors import XmrError

def report_settings(dataset: str, config_dir: str | os.PathLike = "config") -> dict:
    """Settings of the report of ``dataset``: the file's ``default`` (every key, the one place they are written),
    then its ``datasets.{dataset}`` overrides."""
    path = Path(config_dir) / "report.yaml"
    if not path.exists():
        raise XmrError(f"{path}: not found; the report reads its settings from it (copy the repository's "
                       f"config/report.yaml)")
    doc = load_validated(path, "report")
    return deep_merge(doc["default"], (doc.get("datasets") or {}).get(dataset, {}))


def report_methods(dataset: str, settings: dict, config_dir: str | os.PathLike = "config") -> list[str]:
    """Recipes of the report, in table order: the settings' list, else every recipe file of the dataset."""
    recipes = Path(config_dir) / "recipes" / dataset
    if settings["methods"] is not None:
        return list(settings["methods"])
    return sorted(p.stem for p in recipes.glob("*.yaml"))


def readme_parts(dataset: str, settings: dict) -> list[str]:
    """The generated Markdown files README.md shows for ``dataset`` (section ``results-{dataset}``)."""
    return [p.format(dataset=dataset) for p in settings["readme"]]


def results_page(dataset: str, settings: dict) -> tuple[str, list[str]]:
    """The generated docs page of ``dataset`` and the files pasted into it (section ``results-{dataset}``)."""
    page = settings["results_page"]
    return page["path"].format(dataset=dataset), [p.format(dataset=dataset) for p in page.get("parts", [])]


def doc_section(dataset: str, settings: dict, name: str) -> tuple[str, list[str]]:
    """A generated section of a docs page (``doc_sections.{name}``): the page and the files pasted into its section
    ``{name}-{dataset}``."""
    sections = settings["doc_sections"]
    if name not in sections:
        raise XmrError(f"config/report.yaml: no doc_sections.{name} for dataset {dataset}; sections: "
                       f"{', '.join(sections) or 'none'}")
    sec = sections[name]
    return sec["path"].format(dataset=dataset), [p.format(dataset=dataset) for p in sec["parts"]]


__all__ = ["report_settings", "report_methods", "readme_parts", "results_page", "doc_section"]
