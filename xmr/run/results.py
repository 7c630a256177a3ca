"""Test-set results of a trained run: every protocol of its dataset, optionally re-ranked, as one JSON file
(``results/{dataset}/{recipe}[_{reranker}].json``), also logged to the run's MLflow run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from xmr.run.layout import tracked_result_name
from xmr.core.errors import XmrError
from xmr.core.io import read_json, write_json
from xmr.run.tracking import Tracker, metrics_to_flat


def evaluate_run(run_dir: str | os.PathLike, sims_path: str | os.PathLike, rerank: str | None = None,
                 rerank_params: dict[str, float] | None = None, track: bool = True,
                 keep_ranks: bool = False, dataset: str | None = None) -> dict[str, Any]:
    """Results dict: the headline protocol's metrics at top level, all protocols under ``protocols``, the
    spread of the (plain) test matrix (``similarity_spread``, xmr/evaluation/spread.py) and, for a set method, how
    far apart its sub-embeddings are on the test split (``set_statistics``, xmr/evaluation/set_stats.py).
    ``keep_ranks=True`` adds ``query_ranks``: the headline protocol's per-query ranks and the split's subset masks
    (arrays, for :func:`write_query_ranks`; not JSON). ``dataset``: ``sims`` is of another dataset's test split
    (:func:`xmr.run.config.on_dataset`); the results file says so (``trained_on``), and MLflow, whose test metrics
    are the run's own dataset's, gets nothing."""
    from xmr.evaluation import evaluate_sims, get_protocol
    from xmr.evaluation.extended import positives_from_caption_lists
    from xmr.run.gallery_cache import read_set_statistics
    from xmr.evaluation.spread import similarity_spread
    from xmr.run.config import load_saved_config, on_dataset  # imports the methods (their schemas): not at module level
    from xmr.settings.run_settings import run_settings

    run_dir = Path(run_dir)
    own = load_saved_config(run_dir)
    cfg = on_dataset(own, dataset)
    settings = run_settings(cfg)
    if not Path(sims_path).exists():
        raise XmrError(f"{sims_path}: similarity matrix not found; run `xmr score --run {run_dir}` first")
    sims = np.load(sims_path)
    ds = cfg["dataset_cfg"]
    protocols = cfg["eval"]["protocols"] or ds["protocols"]
    params = arrays = None
    train_info = read_json(run_dir / "train.json") if (run_dir / "train.json").exists() else {}
    if rerank:
        from xmr.config.loader import load_array_params, rerank_params as resolve_rerank_params

        params = resolve_rerank_params(rerank, ds["rerank_defaults"], cfg["eval"]["rerank"],
                                       _validation_scale(rerank, train_info, run_dir) | dict(rerank_params or {}))
        arrays = load_array_params(params, f"re-ranker {rerank!r}")  # .npy paths (QB-Norm's bank) as arrays
    labels = subsets = positives = image_ids = None
    coco_ids = any(p in ("eccv", "cxc") for p in protocols)
    if any(p == "cub" for p in protocols) or ds.get("format") == "karpathy" or coco_ids:
        from xmr.run.gallery_cache import read_gallery

        # written by `xmr score`: no re-read of the split
        cached = read_gallery(run_dir, settings, ds["test_split"])
        if cached is not None:
            labels, subsets, positives = cached["image_labels"], cached["subsets"], cached["positives"]
            image_ids, shape = cached["image_ids"], (len(cached["image_ids"]), len(cached["captions"]))
        else:
            from xmr.data import load_split

            split = load_split(ds, ds["test_split"])
            labels, subsets, positives = split.image_labels, split.extra.get("subsets"), split.extra.get("positives")
            image_ids, shape = split.image_ids, (split.num_images, split.num_captions)
        if sims.shape != shape:  # a matrix of another shape (a sub-sample): the protocol check reports it
            subsets = positives = image_ids = None
    by_protocol, query_ranks = {}, None
    for p in protocols:  # rounded here, so that MLflow gets the numbers the results file holds
        if p == "cub":
            kw = {"image_labels": labels}
        elif p in ("eccv", "cxc"):  # rows in the split's order: its COCO ids say which image each is
            from xmr.data.coco_positives import coco_positives

            kw = {"positives": coco_positives(p, image_ids)} if image_ids is not None else {}
        else:
            kw = {"subsets": subsets}
            if positives is not None and get_protocol(p).folds == 1:
                kw["positives"] = positives_from_caption_lists(positives["t2i"], sims.shape[0], positives["source"])
        metrics = evaluate_sims(sims, protocol=p, captions_per_image=ds["captions_per_image"], rerank=rerank,
                                rerank_params=arrays, keep_ranks=keep_ranks and p == protocols[0] and p != "cub",
                                **kw)
        if "query_ranks" in metrics:
            query_ranks = {**metrics.pop("query_ranks"), "subsets": subsets or {},
                           "captions_per_image": int(ds["captions_per_image"])}
        by_protocol[p] = rounded_metrics(metrics)
    head = by_protocol[protocols[0]]
    result = {**head, "protocol": protocols[0], "protocols": by_protocol, "dataset": cfg["dataset"],
              "recipe": cfg["name"], "method": cfg["method"], "backbone": cfg["features"]["backbone"],
              "rerank": rerank or "none", "rerank_params": params or {},
              "best_epoch": train_info.get("best_epoch"), "mlflow_run_id": train_info.get("mlflow_run_id"),
              "similarity_spread": similarity_spread(sims, ds["captions_per_image"]),
              **{k: train_info.get(k) for k in TRAINING_KEYS}}
    other = None if cfg is own else cfg["dataset"]
    if other is not None:
        result["trained_on"], track = own["dataset"], False
    # written by `xmr score` for set methods
    set_stats = read_set_statistics(run_dir, settings, ds["test_split"], other)
    if set_stats is not None:
        result["set_statistics"] = set_stats
    if track and cfg.get("tracking", {}).get("enabled", True) and train_info.get("mlflow_run_id"):
        tracker = Tracker(True)
        with tracker.run(train_info["experiment"], cfg["name"], run_id=train_info["mlflow_run_id"]):
            tag = rerank or "plain"
            for p, m in by_protocol.items():
                tracker.log_metrics(metrics_to_flat(m, f"test_{tag}/{p}"))
            # what `xmr mlflow-table` shows beside the metrics, as `xmr show` does from the results file
            tracker.log_metrics({"test_similarity_std": result["similarity_spread"]["std"]})
            tracker.set_tags({k: result[k] for k in ("epochs_trained", "stopped_by") if result.get(k) is not None})
            tracker.log_dict(result, tracked_result_name(cfg["name"], tag))
    if query_ranks is not None:
        result["query_ranks"] = query_ranks
    return result


#: what a results file repeats from the run's train.json: how training ended (xmr/train/stopping.py)
TRAINING_KEYS = ("epochs_trained", "stopped_by", "train_seconds", "val_similarity")


def _validation_scale(rerank: str, train_info: dict, run_dir: Path) -> dict[str, float]:
    """``val_mean`` / ``val_std`` from train.json for the re-rankers that rescale with validation statistics
    (xmr/rerank/standardised.py); nothing for the others."""
    from xmr.rerank import RERANKERS

    if "val_std" not in RERANKERS.get(rerank).defaults:
        return {}
    stats = train_info.get("val_similarity")
    if not stats and (run_dir / "ensemble.json").exists():  # xmr.studies.ensembles: no training, no validation
        raise XmrError(f"{run_dir}: an ensemble has no validation similarity statistics, which re-ranker "
                       f"{rerank!r} rescales with; evaluate the ensemble with another re-ranker")
    if not stats:
        raise XmrError(f"{run_dir / 'train.json'}: no val_similarity (the validation similarity statistics that "
                       f"re-ranker {rerank!r} rescales with); retrain the run with this version")
    return {"val_mean": float(stats["mean"]), "val_std": float(stats["std"])}


def evaluate_run_many(run_dir: str | os.PathLike, sims_path: str | os.PathLike, reranks: list[str],
                      track: bool = True, keep_ranks: bool = False, dataset: str | None = None) -> dict[str, Any]:
    """One results dict per re-ranker (``none`` = plain) of the same run: ``{"by_rerank": {name: result}}`` plus
    the run's identity (what the seeded benchmark stores per run); ``keep_ranks``: each one's ``query_ranks``."""
    by = {r: evaluate_run(run_dir, sims_path, None if r == "none" else r, None, track, keep_ranks, dataset)
          for r in reranks}
    first = by[reranks[0]]
    keys = ("dataset", "recipe", "method", "backbone", "best_epoch", "mlflow_run_id", "protocol",
            "similarity_spread", "set_statistics", *TRAINING_KEYS)
    transfer = {"trained_on": first["trained_on"]} if "trained_on" in first else {}
    return {**{k: first.get(k) for k in keys}, **transfer, "by_rerank": by}


def write_query_ranks(path: str | os.PathLike, result: dict) -> None:
    """Pop the ``query_ranks`` of a results dict (one evaluation, or ``by_rerank``'s) and write them to one .npz
    (atomically; empty for a class-level protocol): ``{rerank}/i2t``, ``{rerank}/t2i`` (0-based rank of each query's first positive),
    ``subset/{name}/images|captions`` (boolean masks) and ``captions_per_image``."""
    from xmr.core.io import atomic_path

    by = result["by_rerank"] if "by_rerank" in result else {result.get("rerank") or "none": result}
    arrays: dict[str, np.ndarray] = {}
    for rerank, res in by.items():
        kept = res.pop("query_ranks", None)
        if kept is None:  # a class-level headline protocol (cub) ranks classes, not a query's own positives
            continue
        arrays[f"{rerank}/i2t"], arrays[f"{rerank}/t2i"] = kept["i2t"], kept["t2i"]
        arrays["captions_per_image"] = np.asarray(kept["captions_per_image"])
        for name, sub in kept["subsets"].items():
            for side in ("images", "captions"):
                arrays[f"subset/{name}/{side}"] = np.asarray(sub[side], dtype=bool)
    with atomic_path(path, ".npz") as tmp:
        np.savez_compressed(tmp, **arrays)


def read_query_ranks(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """What :func:`write_query_ranks` wrote, as ``{key: array}``."""
    if not Path(path).exists():
        raise XmrError(f"{path}: no per-query ranks; re-run the evaluation (`xmr test ... --ranks-out {path}`)")
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


#: decimals of every metric a results file holds: each recall of COCO (5K, and the mean of the 1K folds) and of
#: Flickr30K is a multiple of 0.004, exact at 3 decimals; what floating-point sums add beyond that (RSUM
#: 22.599999999999998) is noise. The tables print one decimal (docs/evaluation.md, "Output").
METRIC_DECIMALS = 3
#: the dicts of a results file whose numbers are all metrics (recalls, medr, meanr, R-Precision); RSUM is ``rsum``
DIRECTIONS = ("i2t", "t2i")


def rounded_metrics(doc: Any) -> Any:
    """``doc`` (a results dict, or part of one) with every metric rounded to :data:`METRIC_DECIMALS`: the numbers
    of each ``i2t``/``t2i`` dict and each ``rsum``, at any depth (protocols, subsets, the coco1k folds, a
    ``--reranks`` file's ``by_rerank``, the compact file); the other numbers (similarity spread, set statistics,
    re-ranker parameters, timings, seconds) are left as they are."""
    if isinstance(doc, list):
        return [rounded_metrics(v) for v in doc]
    if not isinstance(doc, dict):
        return doc
    out = {}
    for key, value in doc.items():
        if key in DIRECTIONS and isinstance(value, dict):
            out[key] = {k: _rounded(v) for k, v in value.items()}
        elif key == "rsum":
            out[key] = _rounded(value)
        else:
            out[key] = rounded_metrics(value)
    return out


def _rounded(value: Any) -> Any:
    return round(value, METRIC_DECIMALS) if isinstance(value, float) else value


#: what the compact metrics file keeps of each protocol and subset (``dvc metrics show``'s columns)
COMPACT_RECALLS = ("r1", "r5", "r10")


def _compact(metrics: dict) -> dict:
    out = {d: {k: metrics[d][k] for k in COMPACT_RECALLS} for d in ("i2t", "t2i")} | {"rsum": metrics["rsum"]}
    for key, keep in (("extended", "map_at_r"), ("cxc", "r1")):  # extended positives: their headline number
        if metrics.get(key):
            out[key] = {d: {keep: metrics[key][d][keep]} for d in ("i2t", "t2i")}
    return out


def compact_metrics(result: dict) -> dict:
    """R@1/5/10 both directions and RSUM (and the mAP@R of ``extended`` / R@1 of ``cxc`` where evaluated) per
    protocol and per evaluation subset of a results dict:
    ``{protocol: {i2t: {r1, r5, r10}, t2i: {...}, rsum, subsets: {name: {i2t, t2i, rsum}}}}``, each value the
    full results' own (``result["protocols"][protocol]...``); a ``--reranks`` file gives one such dict per
    re-ranker. CUB's class-level protocol (no RSUM) keeps its R-Precision and R@1 instead."""
    if "by_rerank" in result:
        return {name: compact_metrics(r) for name, r in result["by_rerank"].items()}
    out = {}
    for protocol, m in result["protocols"].items():
        if "rsum" not in m:  # cub
            out[protocol] = {d: {k: m[d][k] for k in ("r_precision", "r1")} for d in ("i2t", "t2i")}
            continue
        out[protocol] = _compact(m)
        if m.get("subsets"):
            out[protocol]["subsets"] = {name: _compact(sub) for name, sub in m["subsets"].items()}
    return out


def write_results(result: dict, out: str | os.PathLike, metrics_out: str | os.PathLike | None = None) -> None:
    """The one writer of results files (``xmr test``, ``xmr evaluate``): the full results JSON at ``out``, its
    metrics rounded (:func:`rounded_metrics`); with ``metrics_out``, also the compact file DVC shows as metrics
    (:func:`compact_metrics`, ``results/{dataset}/{target}.metrics.json``)."""
    result = rounded_metrics(result)
    write_json(out, result)
    if metrics_out is not None:
        write_json(metrics_out, compact_metrics(result))
