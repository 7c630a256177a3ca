"""The compact metrics file DVC shows (xmr.run.results.compact_metrics via `xmr test --metrics-out`): exactly R@1/5/10
both directions and RSUM per protocol and subset, each value the full results JSON's own."""

from __future__ import annotations

import numpy as np

from xmr.core.io import read_json
from xmr.evaluation import evaluate_sims
from xmr.run.results import compact_metrics, write_results

DIRECTIONS = [f"{d}.{k}" for d in ("i2t", "t2i") for k in ("r1", "r5", "r10")] + ["rsum"]


def flat(doc: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in doc.items():
        out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _results() -> dict:
    """What xmr.run.results.evaluate_run writes for a 4-image, 2-captions-per-image test split with one subset (image
    0 and its captions): every caption closest to its own image, so every recall is 100 and RSUM 600."""
    sims = np.eye(4).repeat(2, axis=1) + 0.01 * np.arange(8)[None, :]
    subsets = {"ambiguous": {"images": np.array([1, 0, 0, 0], bool), "captions": np.array([1, 1] + [0] * 6, bool)}}
    plain = evaluate_sims(sims, protocol="plain", captions_per_image=2, subsets=subsets)
    return {**plain, "protocols": {"plain": plain}, "recipe": "toy", "rerank": "none", "rerank_params": {}}


def test_compact_file_has_exactly_recalls_and_rsum_per_protocol_and_subset(tmp_path):
    result = _results()
    write_results(result, tmp_path / "toy.json", tmp_path / "toy.metrics.json")
    full, compact = read_json(tmp_path / "toy.json"), read_json(tmp_path / "toy.metrics.json")
    shown = flat(compact)
    assert sorted(shown) == sorted([f"plain.{k}" for k in DIRECTIONS]
                                   + [f"plain.subsets.ambiguous.{k}" for k in DIRECTIONS])
    assert len(shown) == 14  # dvc metrics show: 14 columns per synth result instead of 79
    full_flat = flat(full["protocols"])
    assert all(shown[k] == full_flat[k] for k in shown)
    assert shown["plain.rsum"] == 600 and shown["plain.subsets.ambiguous.rsum"] == 600
    assert compact_metrics(full) == compact


def test_several_rerankers_and_cub():
    result = _results()
    assert compact_metrics({"by_rerank": {"none": result, "fr": result}}) == {
        name: compact_metrics(result) for name in ("none", "fr")}
    cub = {"protocols": {"cub": {d: {"r_precision": 50.0, "r1": 75.0, "r5": 100.0, "r10": 100.0}
                                 for d in ("i2t", "t2i")}}}
    assert flat(compact_metrics(cub)) == {"cub.i2t.r_precision": 50.0, "cub.i2t.r1": 75.0,
                                          "cub.t2i.r_precision": 50.0, "cub.t2i.r1": 75.0}
