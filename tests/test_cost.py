"""Inference cost (xmr/evaluation/cost.py, benchmarks/bench_cost.py): FLOPs of one layer and of one set similarity
worked out by hand, and the cost script's DivE and DVSE Table IV records on a tiny shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from xmr.core.errors import XmrError
from xmr.evaluation.cost import count_flops, similarity_pair_macs, top_k
from xmr.similarity.measures import set_similarity

from conftest import xmr_env

REPO = Path(__file__).resolve().parents[1]


def test_flops_of_one_linear_layer_by_hand():
    # Linear(3 -> 4) on a batch of 5: 5 x 4 outputs, each 3 multiply-adds = 60 MACs = 120 FLOPs (bias adds: 0)
    layer = torch.nn.Linear(3, 4)
    assert count_flops(layer, torch.randn(5, 3)) == 2 * 3 * 4 * 5 == 120
    assert count_flops(layer, torch.randn(5, 3), convention="mac") == 60
    with pytest.raises(XmrError, match="FLOP convention 'ops': choose one of flop, mac"):
        count_flops(layer, torch.randn(5, 3), convention="ops")


def test_one_set_similarity_costs_k_l_d_multiply_adds():
    # DivE's count: K x L element dot products of D numbers (16.4K for K = L = 4, D = 1024; VSE∞ 1,024)
    assert similarity_pair_macs(4, 4, 1024) == 16384 and similarity_pair_macs(1, 1, 1024) == 1024
    x, y = torch.randn(1, 4, 8), torch.randn(1, 4, 8)
    for measure in ("smooth_chamfer", "chamfer", "max"):
        assert count_flops(set_similarity, x, y, measure=measure, convention="mac") == 4 * 4 * 8
    # 3 images x 2 captions: 6 pairs
    assert count_flops(set_similarity, torch.randn(3, 4, 8), torch.randn(2, 4, 8), measure="max",
                       convention="mac") == 6 * 128


def test_top_k_of_both_directions():
    sims = torch.tensor([[0.1, 0.9, 0.5], [0.8, 0.2, 0.3]])
    i2t, t2i = top_k(sims, 2)
    assert i2t.tolist() == [[1, 2], [0, 2]]
    assert t2i.tolist() == [[1, 0], [0, 1], [0, 1]]  # each caption's 2 images (only 2 exist)


def test_cost_script_records_dive_and_dvse_table_iv(tmp_path):
    """`benchmarks/bench_cost.py` at a tiny fraction of synth's shape: DivE's per-pair multiply-adds counted equal
    K·L·D of the synth recipes (K = 4, D = 256: 4,096, 16x VSE∞'s 256), and one DVSE test time per re-ranker."""
    out = tmp_path / "cost.json"
    r = subprocess.run([sys.executable, "benchmarks/bench_cost.py", "--shapes", "synth", "--scale", "0.01",
                        "--repeat", "1", "--sections", "dive", "dvse", "--reranks", "fr", "mr", "--json", str(out),
                        "--markdown", str(tmp_path / "cost.md")], cwd=REPO, env=xmr_env(), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    dive = res["dive"][0]["methods"]
    assert (dive["dive"]["K"], dive["dive"]["D"], dive["vse_inf"]["K"]) == (4, 256, 1)
    assert dive["dive"]["pair_macs_counted"] == dive["dive"]["pair_macs_formula"] == 4 * 4 * 256
    assert dive["vse_inf"]["pair_macs_counted"] == 256 and dive["dive"]["macs_over_vse_inf"] == 16
    assert [row["rerank"] for row in res["dvse"]] == ["none", "fr", "mr"]
    assert all(row["test_time_s"] > 0 and row["K"] == 6 for row in res["dvse"])
    md = (tmp_path / "cost.md").read_text()
    assert "| dive | 4, 256 | 4,096 (=) | 16 |" in md and "2-core Intel Xeon VM with AVX-512" in md
