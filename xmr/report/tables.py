"""Results tables (Markdown / CSV) from ``results/{dataset}/*.json``.

``result_rows`` reads results files (a row per evaluation: the headline protocol); ``markdown_table``/``csv_table``
format rows; ``write_summary`` writes ``summary.{json,md,csv}`` (the ``summary`` rule; ``summary.md`` is the
README table: method, R@1/5/10 both directions, RSUM and training time).
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Any, Iterable

from xmr.run.layout import RUNS_ROOT, RunKey
from xmr.core.io import read_json
from xmr.evaluation.metrics import saturated_recalls, saturation_note

RECALLS = [f"{d} R@{k}" for d in ("i2t", "t2i") for k in (1, 5, 10)]
# mAP@R over extended positives (a dataset's own, synth's scene-checked ones, or ECCV Caption's: ``extended`` in a
# results file), beside RSUM
EXTENDED = ["i2t mAP@R (ext.)", "t2i mAP@R (ext.)"]
# what the report adds for protocols eccv and cxc (ECCV Caption R-Precision and R@1, CxC R@1/5/10)
EXTENDED_DETAIL = [f"{d} {m} (ext.)" for d in ("i2t", "t2i") for m in ("R-P", "R@1")]
CXC = [f"{d} CxC R@{k}" for d in ("i2t", "t2i") for k in (1, 5, 10)]
# `xmr show` (the demo's table): also how training ended (epochs, plateau / cap), the test matrix's spread and, for
# set methods, the mean off-diagonal cosine of an image's sub-embeddings on the test split (DVSE Fig. 6's measure)
COLUMNS = ["dataset", "target", "protocol", *RECALLS, "RSUM", *EXTENDED, "epochs", "ended by", "test sim. std", "set corr."]
# summary.md (the README table): what was trained, how well, and how long it took
SUMMARY_COLUMNS = ["target", "method", "protocol", *RECALLS, "RSUM", "train (min)"]


def run_dir_of(result: dict, runs_root: str | os.PathLike = RUNS_ROOT) -> Path:
    """The run directory a results file was computed from: ``run_dir`` when the file records it, else the run key
    its run name gives (``{recipe}``, ``{experiment}.{variant}``, ``{benchmark}.{variant}.s{seed}``) under the dataset
    it was trained on (``trained_on`` when it was evaluated on another, ``xmr test --dataset``)."""
    if result.get("run_dir"):
        return Path(result["run_dir"])
    parts, dataset = str(result["recipe"]).split("."), result.get("trained_on") or result["dataset"]
    if len(parts) == 3 and parts[2][:1] == "s" and parts[2][1:].isdigit():
        key = RunKey.benchmark(dataset, parts[0], parts[1], int(parts[2][1:]))
    elif len(parts) == 2:
        key = RunKey.experiment(dataset, parts[0], parts[1])
    else:
        key = RunKey.recipe(dataset, parts[0])
    return key.run_dir(runs_root)


def train_seconds(run_dir: str | os.PathLike) -> float | None:
    """``train_seconds`` from a run's ``train.json`` (None when the run or the field is missing)."""
    p = Path(run_dir) / "train.json"
    if not p.exists():
        return None
    value = read_json(p).get("train_seconds")
    return float(value) if value is not None else None


def metric_row(metrics: dict) -> dict[str, Any]:
    """Recall and RSUM columns of one protocol's metrics (``rsum`` absent for class-level protocols: the sum of
    the six recalls is used then, as RSUM is defined)."""
    row: dict[str, Any] = {f"{d} R@{k}": metrics.get(d, {}).get(f"r{k}") for d in ("i2t", "t2i") for k in (1, 5, 10)}
    rsum = metrics.get("rsum")
    if rsum is None and all(row[c] is not None for c in RECALLS):
        rsum = sum(row[c] for c in RECALLS)
    row["RSUM"] = rsum
    for d in ("i2t", "t2i"):
        if "r_precision" in metrics.get(d, {}):
            row[f"{d} R-P"] = metrics[d]["r_precision"]
    return row | extended_cells(metrics)


def extended_cells(metrics: dict) -> dict[str, Any]:
    """The extended-positive columns of a results dict's ``extended`` / ``cxc`` (or a paper entry's): absent keys
    give no cell."""
    row: dict[str, Any] = {}
    ext, cxc = metrics.get("extended") or {}, metrics.get("cxc") or {}
    for d in ("i2t", "t2i"):
        for key, col in (("map_at_r", f"{d} mAP@R (ext.)"), ("r_precision", f"{d} R-P (ext.)"), ("r1", f"{d} R@1 (ext.)")):
            if (ext.get(d) or {}).get(key) is not None:
                row[col] = ext[d][key]
        for k in (1, 5, 10):
            if (cxc.get(d) or {}).get(f"r{k}") is not None:
                row[f"{d} CxC R@{k}"] = cxc[d][f"r{k}"]
    return row


def results_kind(doc: Any) -> str | None:
    """What a results file that xmr writes holds: ``results`` (``xmr test``, ``xmr evaluate``: a headline protocol
    and its metrics), ``by_rerank`` (``xmr test --reranks``, a benchmark run's file: one results dict per
    re-ranker), ``metrics`` (the compact file of ``--metrics-out``: protocol -> recalls and RSUM) or
    ``metrics_by_rerank`` (that file of a ``--reranks`` evaluation: re-ranker -> protocol -> ...); None for
    anything else (a run's train.json, a config)."""
    if not isinstance(doc, dict) or not doc:
        return None
    if "protocol" in doc and isinstance(doc.get("i2t"), dict):
        return "results"
    by = doc.get("by_rerank")
    if isinstance(by, dict) and by and all(results_kind(r) == "results" for r in by.values()):
        return "by_rerank"
    if all(_is_compact(v) for v in doc.values()):
        return "metrics"
    if all(isinstance(v, dict) and v and all(_is_compact(m) for m in v.values()) for v in doc.values()):
        return "metrics_by_rerank"
    return None


def _is_compact(metrics: Any) -> bool:
    """One protocol's entry of a compact metrics file: both directions' recalls."""
    return isinstance(metrics, dict) and isinstance(metrics.get("i2t"), dict) and isinstance(metrics.get("t2i"), dict)


def results_in(path: str | os.PathLike, name_by: str = "target") -> list[tuple[str, dict]]:
    """``(target, results)`` for each evaluation a results file holds (:func:`results_kind`): the file itself, each
    re-ranker of a ``by_rerank`` file (with the run's identity), or a compact file's protocols (named by the file,
    ``dvse_fr.metrics.json`` -> ``dvse_fr``). A file of no run (``xmr evaluate --out M.json``) is named by the file
    too, and so is every file with ``name_by="file"`` (several evaluations of one run, as DivE Table 5's element
    rows). A file of any other kind is a one-line error naming it."""
    from xmr.core.errors import XmrError

    doc = read_json(path)
    kind = results_kind(doc)
    name = Path(path).name.removesuffix(".json").removesuffix(".metrics")

    def row_name(result: dict) -> str:
        return _with_rerank(name, result.get("rerank")) if name_by == "file" else _target(result, name)

    if kind == "results":
        return [(row_name(doc), doc)]
    if kind == "by_rerank":
        identity = {k: v for k, v in doc.items() if k != "by_rerank"}
        runs = [{**identity, **res, "rerank": rerank} for rerank, res in _plain_first(doc["by_rerank"])]
        return [(row_name(r), r) for r in runs]
    if kind == "metrics":
        return [(name, {"protocol": next(iter(doc)), "protocols": doc})]
    if kind == "metrics_by_rerank":
        return [(_with_rerank(name, rerank), {"protocol": next(iter(by)), "protocols": by, "rerank": rerank})
                for rerank, by in _plain_first(doc)]
    what = "a run's train.json" if isinstance(doc, dict) and "best_epoch" in doc else "not a results file"
    raise XmrError(f"{path}: {what} (no retrieval metrics); the results files are results/{{dataset}}/{{target}}.json "
                   f"and their .metrics.json, and what xmr evaluate / xmr test write with --out / --metrics-out")


def _target(result: dict, name: str) -> str:
    """A row's name: the run's recipe with its re-ranker (``dvse_fr``), or the file's name for a file of no run."""
    return _with_rerank(result["recipe"], result.get("rerank")) if "recipe" in result else name


def _with_rerank(name: str, rerank: str | None) -> str:
    return name if rerank in (None, "none") else f"{name}_{rerank}"


def _plain_first(by_rerank: dict) -> list[tuple[str, Any]]:
    """A file's evaluations by re-ranker, plain (``none``) first, then the others as the file has them (by name)."""
    return sorted(by_rerank.items(), key=lambda item: item[0] != "none")


def result_rows(paths: Iterable[str | os.PathLike], runs_root: str | os.PathLike = RUNS_ROOT,
                all_protocols: bool = False, name_by: str = "target") -> list[dict]:
    """One row per evaluation of each results file (:func:`results_in`: a ``--reranks`` file gives one per
    re-ranker) at its headline protocol, or per evaluation x protocol with ``all_protocols``."""
    rows = []
    for p in paths:
        for target, r in results_in(p, name_by):
            rerank = r.get("rerank", "none") or "none"
            secs = train_seconds(run_dir_of(r, runs_root)) if "recipe" in r and "dataset" in r else None
            protocols = r.get("protocols") or {r["protocol"]: r}
            names = list(protocols) if all_protocols else [r["protocol"]]
            # the headline row shows extended positives evaluated under another protocol (COCO: eccv) beside it
            ext = next((m for m in protocols.values() if isinstance(m, dict) and m.get("extended")), {})
            for name in names:
                row = metric_row(protocols.get(name, r))
                if not all_protocols and not any(c in row for c in EXTENDED):
                    row |= {c: v for c, v in extended_cells(ext).items() if c in EXTENDED}
                rows.append({"dataset": r.get("dataset"), "target": target, "recipe": r.get("recipe"),
                             "method": r.get("method"), "rerank": rerank, "protocol": name, **row,
                             "train (min)": None if secs is None else secs / 60.0, "path": str(p),
                             "epochs": r.get("epochs_trained"), "ended by": r.get("stopped_by"),
                             "test sim. std": _std_text(r.get("similarity_spread")),
                             "set corr.": _set_text(r.get("set_statistics")),
                             "saturated": saturated_recalls(protocols.get(name, r))})
    return rows


def saturation_notes(rows: list[dict]) -> str | None:
    """The note under a results table whose rows have recalls that are 100 by construction (:func:`saturated_recalls`),
    said once per distinct gallery, naming its targets."""
    targets: dict[str, list[str]] = {}
    for row in rows:
        if row.get("saturated"):
            targets.setdefault(row["saturated"], []).append(row["target"])
    return "\n".join(f"{saturation_note(s)} (in {', '.join(dict.fromkeys(t))})" for s, t in targets.items()) or None


def _std_text(spread: dict | None) -> str | None:
    return None if not spread else f"{spread['std']:.4f}"


def _set_text(stats: dict | None, key: str = "correlation") -> str | None:
    """A set statistic (the correlation; DivE's circular variance) of a set method's results (None: a
    single-embedding method, or an older file)."""
    return None if not stats or stats.get(key) is None else f"{stats[key]:.3f}"


def fmt(v: Any, digits: int = 1) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


# `xmr show RUN_DIR`: a run's epochs, from its train.json (or, while it trains, its history.csv)
HISTORY_COLUMNS = ["epoch", "loss", "lr", "val RSUM", "val sim. std", "seconds"]


def _num(v: Any, spec: str) -> str:
    return "—" if v is None else format(v, spec)


def _history_rows(history: list[dict]) -> list[dict]:
    return [{"epoch": _num(h.get("epoch"), ".0f"), "loss": _num(h.get("loss"), ".4f"), "lr": _num(h.get("lr"), ".3g"),
             "val RSUM": _num(h.get("val_rsum"), ".1f"), "val sim. std": _num(h.get("val_sim_std"), ".4f"),
             "seconds": _num(h.get("seconds"), ".1f")} for h in history]


def _train_summary(path: Path) -> dict:
    """A run's ``train.json``, checked to hold its epochs."""
    from xmr.core.errors import XmrError

    s = read_json(path)
    if not isinstance(s, dict) or not isinstance(s.get("history"), list) or "best_epoch" not in s:
        raise XmrError(f"{path}: a train.json without its epochs (`history`, `best_epoch`); `xmr train` writes the "
                       f"whole summary when training ends")
    return s


def run_history(run: str | os.PathLike) -> tuple[str, list[dict]]:
    """A run's summary line and one row per epoch (values formatted), from ``train.json`` (``run`` is the run
    directory or that file); a run directory without one yet (training, or stopped before its end) shows the
    epochs of its ``history.csv``."""
    path = Path(run) / "train.json" if Path(run).is_dir() else Path(run)
    if not path.exists() and _in_training(path.parent):
        rows = _history_rows(_finished_epochs(path.parent))
        return _training_line(path.parent, len(rows)), rows
    s = _train_summary(path)
    rows = _history_rows(s["history"])
    ended = f", ended by {s['stopped_by']}" if s.get("stopped_by") else ""
    line = (f"{path.parent}: {s.get('method', '?')} (recipe {s.get('recipe', '?')}) on {s.get('dataset', '?')}, "
            f"{s.get('epochs_trained', len(rows))} epoch(s) of at most {s.get('max_epochs', '?')}{ended}; best "
            f"validation RSUM {_num(s.get('best_val_rsum'), '.1f')} at epoch {s['best_epoch']}; "
            f"{_num(s.get('train_seconds'), '.0f')} s of training")
    return line, rows


def _in_training(run_dir: Path) -> bool:
    """A run directory without train.json that has begun training: its progress.json or history.csv."""
    from xmr.run.progress import PROGRESS

    return (run_dir / PROGRESS).is_file() or (run_dir / "history.csv").is_file()


def _finished_epochs(run_dir: Path) -> list[dict]:
    from xmr.core.io import read_history

    return read_history(run_dir) if (run_dir / "history.csv").is_file() else []


def _training_line(run_dir: Path, epochs: int) -> str:
    """A run still training (or stopped before its end): what it trains (config.yaml), its finished epochs
    (history.csv) and, from its first step, where it is (progress.json)."""
    from xmr.config.loader import load_yaml
    from xmr.run.progress import progress_text, read_progress

    cfg = load_yaml(run_dir / "config.yaml") if (run_dir / "config.yaml").is_file() else {}
    what = f" {cfg.get('method', '?')} (recipe {cfg.get('name', '?')}) on {cfg.get('dataset', '?')};" if cfg else ""
    line = (f"{run_dir}:{what} no train.json yet (training, or stopped before its end): {epochs} epoch(s) in "
            f"history.csv")
    progress = read_progress(run_dir)
    if progress:
        import time

        line += f"; at {progress_text(progress)} ({time.time() - progress['written_at']:.0f} s ago)"
    return line


# `xmr show runs/DATASET/` (or runs/): one row per run directory below the folder
RUNS_COLUMNS = ["run", "method", "recipe", "epochs", "ended by", "best val RSUM", "best epoch", "train s"]


def run_row(run_dir: str | os.PathLike) -> dict[str, Any]:
    """A run directory as one row of :data:`RUNS_COLUMNS`: from its ``train.json``, or, before training has
    ended, from its ``history.csv`` (the best validation RSUM so far)."""
    run_dir = Path(run_dir)
    if not (run_dir / "train.json").exists():
        from xmr.config.loader import load_yaml

        hist = _finished_epochs(run_dir)
        best = max(hist, key=lambda h: h.get("val_rsum", float("-inf")), default={})
        cfg = load_yaml(run_dir / "config.yaml") if (run_dir / "config.yaml").is_file() else {}
        return {"run": str(run_dir), "method": cfg.get("method"), "recipe": cfg.get("name"), "epochs": len(hist),
                "ended by": "(no train.json yet)", "best val RSUM": best.get("val_rsum"),
                "best epoch": _num(best.get("epoch"), ".0f")}
    s = _train_summary(run_dir / "train.json")
    return {"run": str(run_dir), "method": s.get("method"), "recipe": s.get("recipe"),
            "epochs": s.get("epochs_trained", len(s["history"])), "ended by": s.get("stopped_by"),
            "best val RSUM": s.get("best_val_rsum"), "best epoch": s["best_epoch"],
            "train s": _num(s.get("train_seconds"), ".0f")}


def markdown_table(rows: list[dict], columns: list[str] = COLUMNS) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def csv_table(rows: list[dict], columns: list[str] = COLUMNS) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


# `xmr show --set-statistics`: how far apart each set method's sub-embeddings are (DVSE Fig. 6, DivE Table 3 right)
SET_COLUMNS = ["target", "K", "set corr.", "circ. var.", "log circ. var.", "caption circ. var.", "residual circ. var."]


def set_statistics_rows(paths: Iterable[str | os.PathLike]) -> list[dict]:
    """One row per results file: its ``set_statistics`` (— for a single-embedding method or an older file)."""
    rows = []
    for p in paths:
        for target, r in results_in(p):
            s = r.get("set_statistics") or {}
            log = s.get("log_circular_variance")
            rows.append({"target": target, "K": s.get("k"), "set corr.": _set_text(s),
                         "circ. var.": _set_text(s, "circular_variance"),
                         "log circ. var.": None if log is None else f"{log:.2f}",
                         "caption circ. var.": _set_text(s, "caption_circular_variance"),
                         "residual circ. var.": _set_text(s, "residual_circular_variance")})
    return rows


def write_summary(result_paths: list[str | os.PathLike], out_dir: str | os.PathLike,
                  runs_root: str | os.PathLike = RUNS_ROOT) -> dict:
    """``summary.json`` (DVC metrics: target -> headline metrics), ``summary.md`` (the README table, with the
    training time from each run's ``train.json``) and ``summary.csv``."""
    from xmr.core.io import atomic_path, write_json

    out = Path(out_dir)
    rows = result_rows(result_paths, runs_root)
    keep = ["protocol", *RECALLS, "RSUM"]
    metrics = {r["target"]: {k.replace(" ", "_").replace("@", ""): r[k] for k in keep} for r in rows}
    write_json(out / "summary.json", metrics)
    note = ("\nTraining time: `train_seconds` of each run's `train.json` (all epochs, validation included), on "
            "the machine that ran the workflow.\n")
    for name, text in (("summary.md", markdown_table(rows, SUMMARY_COLUMNS) + note),
                       ("summary.csv", csv_table(rows, SUMMARY_COLUMNS))):
        with atomic_path(out / name, ".tmp") as tmp:
            tmp.write_text(text)
    return metrics
