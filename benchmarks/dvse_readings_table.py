"""The DVSE readings study's table (docs/methods/dvse.md "Readings study"): validation only.

For each variant of config/experiments/dvse_readings.yaml whose run has finished (``train.json``), scores the best
checkpoint on the validation split with ``xmr score --split val`` (which stores the set statistics,
``set_stats_val.json``), then prints one Markdown row per reading: best validation RSUM, epochs, how the run
ended, training minutes, the sub-embedding and residual correlation, slot usage's normalised entropy, and the norms
of h_V(z) and v̂ before the LayerNorm; then applies the selection rule written in docs/methods/dvse.md.

    python benchmarks/dvse_readings_table.py [--runs runs/synth/exp/dvse_readings] [--tolerance 5.1]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", default="runs/synth/exp/dvse_readings")
    p.add_argument("--experiment", default="config/experiments/dvse_readings.yaml")
    p.add_argument("--tolerance", type=float, default=5.1, help="RSUM within this of the best (the fixed rule)")
    args = p.parse_args()
    from xmr.config.loader import load_yaml
    from xmr.run.gallery_cache import read_set_statistics
    from xmr.settings.run_settings import run_settings
    from xmr.studies.experiments import load_experiment

    exp = load_experiment(args.experiment)
    rows = []
    for variant in exp.variants:
        run = Path(args.runs) / variant
        if not (run / "train.json").exists():
            continue
        info = json.loads((run / "train.json").read_text())
        cfg = load_yaml(run / "config.yaml")
        st = read_set_statistics(run, run_settings(cfg), "val")  # None when missing or computed from another checkpoint
        if st is None:
            with tempfile.TemporaryDirectory() as tmp:
                subprocess.run([sys.executable, "-m", "xmr", "score", "--run", str(run), "--split", "val", "--out",
                                f"{tmp}/val.npy", "--no-progress"], check=True)
            st = read_set_statistics(run, run_settings(cfg), "val")
        rows.append({"reading": variant, "overrides": exp.variants[variant], "val_rsum": info["best_val_rsum"],
                     "epochs": info["epochs_trained"], "best_epoch": info["best_epoch"],
                     "ended": info.get("stopped_by"), "minutes": info["train_seconds"] / 60,
                     "corr": st["correlation"], "res_corr": st.get("residual_correlation"),
                     "entropy": st["slot_usage"]["entropy_normalised"], "freq": st["slot_usage"]["frequency"],
                     "g_norm": st.get("global_norm"), "r_norm": st.get("residual_norm")})
    print("| reading | change | val RSUM | epochs (best) | ended by | train min | correlation v^k | correlation v̂^k "
          "| slot entropy (norm.) | slot frequencies | ‖h_V(z)‖ | ‖v̂^k‖ |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        change = ", ".join(f"`{k}: {v}`" for k, v in r["overrides"].items()) or "— (the recipe)"
        print(f"| {r['reading']} | {change} | {r['val_rsum']:.1f} | {r['epochs']} ({r['best_epoch']}) | {r['ended']} | "
              f"{r['minutes']:.1f} | {r['corr']:.3f} | {r['res_corr']:.3f} | {r['entropy']:.2f} | "
              f"{' '.join(f'{f:.2f}' for f in r['freq'])} | {r['g_norm']:.2f} | {r['r_norm']:.2f} |")
    if rows:
        best = max(r["val_rsum"] for r in rows)
        near = [r for r in rows if r["val_rsum"] >= best - args.tolerance]
        pick = min(near, key=lambda r: r["corr"])
        print(f"\nbest val RSUM {best:.1f}; within {args.tolerance}: {', '.join(r['reading'] for r in near)}; "
              f"lowest correlation among them: {pick['reading']} ({pick['corr']:.3f}, slot entropy "
              f"{pick['entropy']:.2f}); apart (< 0.5 and entropy >= 0.5): "
              f"{pick['corr'] < 0.5 and pick['entropy'] >= 0.5}")


if __name__ == "__main__":
    main()
