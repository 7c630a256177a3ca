"""Inference cost as each seed paper defines it (not a test; the tables go to docs/speed.md "Inference cost").

Three measurements on synthetic unit vectors, each at synth's shape and at the paper's (``--shapes``):

1. ``dive`` (DivE, CVPR 2023, §4.4 and supplement B.1): multiply-adds of one image-caption similarity (counted by
   ``xmr.evaluation.cost.count_flops`` on the similarity formula, and by K·L·D) and the latency of scoring a whole
   test split plus top-10 retrieval in both directions, DivE (K = L = 4, smooth-Chamfer) against VSE∞ (one vector,
   cosine) = 1. The paper measures on Flickr30K validation (1,000 images, 5,000 captions, D = 1024): "VSE∞ 1, ours
   about 16" and 159 ms against 168 ms.
2. ``dvse`` (DVSE, arXiv 2309.08154, Table IV): test time (similarity + ranks + metrics) without re-ranking and with
   FR, RR (MTFN-RR) and MR (GaLR's multivariate re-ranking), at the F30K (1,000 x 5,000) and COCO 5K
   (5,000 x 25,000) shapes, K = 6, D = 1024; the re-ranking's own time beside it. ``bench_eval.py`` times the rest
   of the evaluation engine (FR vs RR at COCO 5K, memory, the reference loop) and this script reuses its data and
   timer.
3. ``oips`` (VSE+2AD, EACL 2023, Tables 2 and 4): "#OIPs, operating items per second", relative throughput. Here:
   images and captions encoded per second by the COCO R + BiGRU model (36 regions x 2048, BiGRU, D = 1024) with
   each aggregator xmr has (ADPOOL, GPO, Manual = 5-MaxPool image / MeanPool text), relative to GPO (the paper's
   Table 4 is relative to GCN, Table 2 to ALIGN, neither of which xmr implements; LIP, Seq2Seq, GCN, SelfAttn,
   AdaPool and SoftPool are not in xmr: docs/methods/vse_2ad.md).

    .venv/bin/python benchmarks/bench_cost.py --shapes synth --json cost.json          # seconds
    .venv/bin/python benchmarks/bench_cost.py --shapes synth paper --markdown cost.md   # minutes (COCO 5K RR, MR)
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SECTIONS = ("dive", "dvse", "oips")
MACHINE_NAME = "2-core Intel Xeon VM with AVX-512"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    ap.add_argument("--shapes", nargs="+", choices=("synth", "paper"), default=["synth"],
                    help="synth: the embedded dataset's test split (1,000 x 5,000, D from its recipes); paper: each "
                         "paper's own (default: synth)")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="fraction of each shape's images and captions (quick checks; default 1)")
    ap.add_argument("--repeat", type=int, default=3, help="keep the fastest of this many runs (default 3)")
    ap.add_argument("--reranks", nargs="+", default=["fr", "rr", "mr"], help="DVSE Table IV's re-rankers")
    ap.add_argument("--machine", default=MACHINE_NAME, help="the machine's name in the Markdown table")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--markdown", default=None, help="write the docs/speed.md tables here")
    return ap


if __name__ == "__main__":
    build_parser().parse_args()  # --help and usage errors answer before torch loads

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_eval import machine, make_data, timed  # noqa: E402

from xmr.evaluation import evaluate_sims  # noqa: E402
from xmr.evaluation.cost import count_flops, similarity_pair_macs, top_k  # noqa: E402
from xmr.run.config import load_run_config  # noqa: E402
from xmr.similarity.measures import compute_similarity, set_similarity  # noqa: E402

CAPTIONS_PER_IMAGE = 5
#: test images of each shape: synth's test split (config/datasets/synth.yaml), F30K 1K, COCO 5K
IMAGES = {"synth": 1000, "f30k": 1000, "coco5k": 5000}
PROTOCOL = {"synth": "plain", "f30k": "f30k", "coco5k": "coco5k"}


def recipe(path: str) -> dict:
    return load_run_config(REPO / "config" / "recipes" / f"{path}.yaml")


def set_shape(rec: dict) -> tuple[int, int]:
    """(K, D) of a recipe's embeddings (K = 1 for single-vector methods)."""
    return int(rec["model"].get("num_embeds") or 1), int(rec["model"]["embed_dim"])


def scaled(n: int, scale: float) -> int:
    return max(10, round(n * scale))


# -- 1. DivE §4.4 / B.1 ----------------------------------------------------------------------------------------

def dive_cost(shape: str, scale: float, repeat: int) -> dict:
    """Per-pair multiply-adds (counted and by formula) and scoring + top-10 latency of DivE and VSE∞."""
    data = "synth" if shape == "synth" else "f30k"  # B.1: Flickr30K validation, 1,000 images
    n = scaled(IMAGES[data], scale)
    out: dict = {"shape": data, "images": n, "captions": n * CAPTIONS_PER_IMAGE, "methods": {}}
    for name, path in (("vse_inf", f"{data}/vse_inf"), ("dive", f"{data}/dive")):
        rec = recipe(path)
        k, d = set_shape(rec)
        measure = rec["eval"]["similarity"]
        one_x, one_y = torch.randn(1, k, d), torch.randn(1, k, d)  # DivE's captions are K-sets too (S^T)
        counted = count_flops(set_similarity, one_x, one_y, measure="max" if k == 1 else measure, convention="mac")
        img, _ = make_data(n, k, d, CAPTIONS_PER_IMAGE, torch.device("cpu"))
        cap = torch.nn.functional.normalize(img.repeat_interleave(CAPTIONS_PER_IMAGE, 0)
                                            + 0.3 * torch.randn(n * CAPTIONS_PER_IMAGE, k, d), dim=-1)
        if k == 1:
            img, cap = img[:, 0], cap[:, 0]

        def score_and_retrieve():
            sims = torch.as_tensor(compute_similarity(img, cap, measure=measure))
            return top_k(sims, 10)

        _, seconds = timed(score_and_retrieve, torch.device("cpu"), repeat)
        out["methods"][name] = {"K": k, "D": d, "measure": measure, "pair_macs_counted": counted,
                                "pair_macs_formula": similarity_pair_macs(k, k, d), "latency_ms": 1000 * seconds}
    base = out["methods"]["vse_inf"]
    for m in out["methods"].values():
        m["macs_over_vse_inf"] = m["pair_macs_counted"] / base["pair_macs_counted"]
        m["latency_over_vse_inf"] = m["latency_ms"] / base["latency_ms"]
    return out


# -- 2. DVSE Table IV --------------------------------------------------------------------------------------------

def dvse_test_time(shape: str, scale: float, repeat: int, reranks: list[str]) -> list[dict]:
    """Test time of DVSE's evaluation from embeddings, plain and with each re-ranker, at one or two shapes."""
    rows = []
    for data in (["synth"] if shape == "synth" else ["f30k", "coco5k"]):
        k, d = set_shape(recipe(f"{'coco' if data == 'coco5k' else data}/dvse"))
        n = scaled(IMAGES[data], scale)
        protocol = PROTOCOL[data] if scale == 1 else "plain"
        img, cap = make_data(n, k, d, CAPTIONS_PER_IMAGE, torch.device("cpu"))
        sims, t_sim = timed(lambda: compute_similarity(img, cap, measure="max"), torch.device("cpu"), repeat)
        for rerank in [None, *reranks]:
            metrics, t_eval = timed(lambda: evaluate_sims(sims, protocol, CAPTIONS_PER_IMAGE, rerank=rerank,
                                                          timing=True), torch.device("cpu"), 1 if rerank else repeat)
            rows.append({"shape": data, "images": n, "captions": n * CAPTIONS_PER_IMAGE, "K": k, "D": d,
                         "rerank": rerank or "none", "similarity_s": t_sim, "evaluate_s": t_eval,
                         "test_time_s": t_sim + t_eval, "rerank_s": metrics["timing_s"]["rerank"]})
            print(f"dvse {data} {rerank or 'none'}: {t_sim + t_eval:.2f} s (re-rank "
                  f"{metrics['timing_s']['rerank']:.2f} s)", flush=True)
    return rows


# -- 3. VSE+2AD #OIPs ----------------------------------------------------------------------------------------------

AGGREGATORS = {"ADPOOL": ("adpool", "adpool"), "GPO": ("gpo", "gpo"), "Manual": ("kmax", "mean")}


def oips(shape: str, scale: float, repeat: int) -> list[dict]:
    """Images + captions encoded per second by VSE+2AD's model with each aggregator, relative to GPO."""
    from xmr.inference.model import model_from_config
    from xmr.text.vocab import SPECIALS

    data = "synth" if shape == "synth" else "coco"
    batch, words = max(8, round(128 * scale)), 12  # the recipes' batch 128
    # BUTD: 36 regions x 2048; synth: EfficientNet-Lite0 at 128 px, a 4 x 4 grid x 1280
    image_dim, regions = (2048, 36) if data == "coco" else (1280, 16)
    vocab = [*SPECIALS, *(f"w{i}" for i in range(10000))]
    rows = []
    for name, (image_pool, text_pool) in AGGREGATORS.items():
        cfg = load_run_config(REPO / "config" / "recipes" / data / "vse_2ad.yaml",
                              [f"model.image_pool={image_pool}", f"model.text_pool={text_pool}",
                               "text.word_vectors=null", "text.word_dim=300"])
        torch.manual_seed(0)
        model = model_from_config(cfg, image_dim, vocab, pretrained_backbone=False).eval()
        feats = torch.randn(batch, regions, image_dim)
        num_regions = torch.full((batch,), regions)
        rng = np.random.default_rng(0)
        captions = [[vocab[i] for i in rng.integers(len(SPECIALS), len(vocab), words)] for _ in range(batch)]
        text_batch = model.text.collate([" ".join(c) for c in captions], captions, None, None)

        def encode():
            with torch.no_grad():
                return model.encode_image(feats, num_regions), model.encode_text(text_batch)

        _, seconds = timed(encode, torch.device("cpu"), repeat)
        rows.append({"shape": data, "aggregator": name, "image_pool": image_pool, "text_pool": text_pool,
                     "batch": batch, "items_per_s": 2 * batch / seconds})
    gpo = next(r["items_per_s"] for r in rows if r["aggregator"] == "GPO")
    for r in rows:
        r["relative_to_gpo"] = r["items_per_s"] / gpo
    return rows


# -- Markdown -------------------------------------------------------------------------------------------------------

def markdown(res: dict, machine_name: str) -> str:
    head = f"{res['date']} | {res['commit']} | {machine_name}"

    def table(columns: list[str], rows: list[str]) -> list[str]:
        return ["| date | commit | machine | " + " | ".join(columns) + " |", "|---" * (3 + len(columns)) + "|",
                *(f"| {head} | {row} |" for row in rows), ""]

    dive = [f"{r['shape']} {r['images']} x {r['captions']} | {name} | {m['K']}, {m['D']} | {m['pair_macs_counted']:,} "
            f"({'=' if m['pair_macs_counted'] == m['pair_macs_formula'] else '≠'}) | {m['macs_over_vse_inf']:.0f} | "
            f"{m['latency_ms']:.0f} | {m['latency_over_vse_inf']:.2f}"
            for r in res.get("dive", []) for name, m in r["methods"].items()]
    dvse = [f"{r['shape']} {r['images']} x {r['captions']}, K {r['K']} | {r['rerank']} | {r['test_time_s']:.2f} | "
            f"{r['rerank_s']:.2f}" for r in res.get("dvse", [])]
    oips = [f"{r['shape']} VSE+2AD, batch {r['batch']} | {r['aggregator']} ({r['image_pool']} / {r['text_pool']}) | "
            f"{r['items_per_s']:,.0f} | {r['relative_to_gpo']:.2f}" for r in res.get("oips", [])]
    lines = []
    if dive:
        lines += table(["shape", "method", "K, D", "MACs / pair (counted = K·L·D)", "× VSE∞", "score + top-10 (ms)",
                        "× VSE∞"], dive)
    if dvse:
        lines += table(["shape", "re-ranker", "test time (s)", "re-ranking (s)"], dvse)
    if oips:
        lines += table(["model", "aggregator (image / text)", "items / s", "× GPO"], oips)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip() or "unknown"
    res: dict = {"machine": machine(), "date": datetime.date.today().isoformat(), "commit": commit,
                 "scale": args.scale, "dive": [], "dvse": [], "oips": []}
    t0 = time.perf_counter()
    for shape in args.shapes:
        if "dive" in args.sections:
            res["dive"].append(dive_cost(shape, args.scale, args.repeat))
            print(json.dumps(res["dive"][-1]), flush=True)
        if "dvse" in args.sections:
            res["dvse"] += dvse_test_time(shape, args.scale, args.repeat, args.reranks)
        if "oips" in args.sections:
            res["oips"] += oips(shape, args.scale, args.repeat)
            print(json.dumps(res["oips"][-3:]), flush=True)
    res["seconds"] = time.perf_counter() - t0
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(markdown(res, args.machine) + "\n")
    print(markdown(res, args.machine))
    return 0


if __name__ == "__main__":
    sys.exit(main())
