"""Results tables (Markdown / CSV) from ``results/{dataset}/*.json``."""

from __future__ import annotations

import csv
import io
import os
from typing import Iterable

from xmr.io import read_json

COLUMNS = ["dataset", "target", "protocol", "i2t R@1", "i2t R@5", "i2t R@10", "t2i R@1", "t2i R@5", "t2i R@10",
           "RSUM"]


def result_rows(paths: Iterable[str | os.PathLike]) -> list[dict]:
    rows = []
    for p in paths:
        r = read_json(p)
        target = r["recipe"] + ("" if r.get("rerank", "none") == "none" else f"_{r['rerank']}")
        rows.append({"dataset": r["dataset"], "target": target, "protocol": r["protocol"],
                     **{f"{d} R@{k}": r[d][f"r{k}"] for d in ("i2t", "t2i") for k in (1, 5, 10)},
                     "RSUM": r["rsum"]})
    return rows


def markdown_table(rows: list[dict], columns: list[str] = COLUMNS) -> str:
    def fmt(v):
        return f"{v:.1f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def csv_table(rows: list[dict], columns: list[str] = COLUMNS) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def write_summary(result_paths: list[str | os.PathLike], out_dir: str | os.PathLike) -> dict:
    """``summary.json`` (DVC metrics: target -> headline metrics), ``summary.md`` and ``summary.csv``."""
    from pathlib import Path

    from xmr.io import atomic_path, write_json

    out = Path(out_dir)
    rows = result_rows(result_paths)
    metrics = {r["target"]: {k.replace(" ", "_").replace("@", ""): v for k, v in r.items()
                             if k not in ("dataset", "target")} for r in rows}
    write_json(out / "summary.json", metrics)
    for name, text in (("summary.md", markdown_table(rows)), ("summary.csv", csv_table(rows))):
        with atomic_path(out / name, ".tmp") as tmp:
            tmp.write_text(text)
    return metrics
