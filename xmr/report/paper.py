"""The numbers the seed papers report (``xmr/report/paper_results.yaml``), matched to xmr results.

An entry matches an xmr result of the same dataset, protocol, re-ranker and recipe (the recipe that reproduces the
paper's setting, see the file's header). Numbers are transcribed from the method cards, never computed here.
"""

from __future__ import annotations

import os
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from xmr.config.loader import safe_load
from xmr.core.errors import XmrError
from xmr.report.tables import extended_cells

ENTRY_KEYS = ("method", "recipe", "dataset", "protocol", "rerank", "setting", "role", "i2t", "t2i", "rsum", "source")
OPTIONAL_KEYS = ("i2t_rp", "t2i_rp", "note", "extended", "cxc")


def _check(doc: dict, src: str) -> dict:
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
        raise XmrError(f"{src}: expected a mapping with a list `entries`")
    for i, e in enumerate(doc["entries"]):
        where = f"{src}: entries[{i}]"
        if not isinstance(e, dict):
            raise XmrError(f"{where}: expected a mapping")
        for k in ENTRY_KEYS:
            if k not in e:
                raise XmrError(f"{where}: missing required key '{k}'")
        extra = set(e) - set(ENTRY_KEYS) - set(OPTIONAL_KEYS)
        if extra:
            raise XmrError(f"{where}: unknown key(s) {', '.join(sorted(extra))}")
        if not str(e["source"]).strip():
            raise XmrError(f"{where}: source: name the paper table the numbers come from")
        for d in ("i2t", "t2i"):
            if not (isinstance(e[d], list) and len(e[d]) == 3):
                raise XmrError(f"{where}: {d}: expected [R@1, R@5, R@10] (null where not reported)")
    for name, exp in (doc.get("experiments") or {}).items():
        for k in ("source", "dataset", "rsum"):
            if k not in exp:
                raise XmrError(f"{src}: experiments.{name}: missing required key '{k}'")
    return doc


@lru_cache(maxsize=4)
def _load(path: str | None) -> dict:
    if path is None:
        text = resources.files("xmr.report").joinpath("paper_results.yaml").read_text()
        src = "xmr/report/paper_results.yaml"
    else:
        if not Path(path).exists():
            raise XmrError(f"{path}: paper results file not found")
        text, src = Path(path).read_text(), path
    return _check(safe_load(text), src)


def load_paper_results(path: str | os.PathLike | None = None) -> dict:
    """``{"entries": [...], "experiments": {...}}`` (validated; the packaged file by default)."""
    return _load(None if path is None else str(path))


def paper_entries(dataset: str | None = None, path: str | os.PathLike | None = None) -> list[dict]:
    return [e for e in load_paper_results(path)["entries"] if dataset is None or e["dataset"] == dataset]


def match_entry(entries: list[dict], dataset: str, recipe: str, protocol: str, rerank: str) -> dict | None:
    """The paper entry for an xmr result (None when the paper reports no number for that setting)."""
    for e in entries:
        if (e["dataset"], e["recipe"], e["protocol"], e["rerank"]) == (dataset, recipe, protocol, rerank):
            return e
    return None


def paper_row(entry: dict) -> dict[str, Any]:
    """An entry in the columns of :func:`xmr.report.tables.metric_row`."""
    row: dict[str, Any] = {f"{d} R@{k}": entry[d][i] for d in ("i2t", "t2i") for i, k in enumerate((1, 5, 10))}
    row["RSUM"] = entry["rsum"]
    for d in ("i2t", "t2i"):
        if entry.get(f"{d}_rp") is not None:
            row[f"{d} R-P"] = entry[f"{d}_rp"]
    return row | extended_cells(entry)


def paper_experiment(name: str, path: str | os.PathLike | None = None) -> dict | None:
    """What a paper prints for an experiment of config/experiments (``{source, dataset, rsum: {variant: ..}}``)."""
    return (load_paper_results(path).get("experiments") or {}).get(name)


__all__ = ["load_paper_results", "paper_entries", "match_entry", "paper_row", "paper_experiment"]
