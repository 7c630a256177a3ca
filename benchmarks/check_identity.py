"""Whether two versions of xmr train alike, bit for bit (not a test: a refactor's proof; results go to
docs/speed.md).

On a toy synth set built here (48 training images at 64 px, EfficientNet-Lite0 grid features), each recipe is
trained for ``--epochs`` through ``xmr train`` and scored through ``xmr score``, once with this checkout's package
and once with the package of ``--base`` (a commit, checked out into a temporary git worktree), in fresh processes
one after the other. It prints, per recipe, whether the histories (every epoch's loss and validation metrics,
timings left out) and the test similarity matrices are identical. Both sides run on the same machine: bit
identity across CPUs is not expected (docs/evaluation.md).

    .venv/bin/python benchmarks/check_identity.py --base HEAD~1
    .venv/bin/python benchmarks/check_identity.py --base 1a2b3c4 --recipes vsepp e2e --epochs 2 --json id.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
TIMING_KEYS = ("seconds", "samples_per_s")
# recipe name -> (method file it extends, sections over it); "e2e" trains from the images through the backbone
RECIPES = {
    "vsepp": ("vsepp", {}),
    "dvse": ("dvse", {}),
    "coder": ("coder", {}),
    "e2e": ("vse_inf", {"features": {"source": "images"},
                        "image_backbone": {"frozen_epochs": 1, "unfreeze_loss_ramp": True, "crop_scale": [0.6, 1.0],
                                           "hflip": 0.5}}),
}


def build_toy_set(root: Path, python: str, pythonpath: Path) -> None:
    """The toy synth set and its features under ``root`` (config dir ``root/config``), made by ``pythonpath``'s xmr."""
    code = f"""
import yaml
from pathlib import Path
from xmr.config.loader import load_backbone_config, load_dataset_config
from xmr.data import load_split
from xmr.data.synth import generate_synth
from xmr.features.extract import extract_features
root = Path({str(root)!r}); cfg_dir = root / "config"; (cfg_dir / "datasets").mkdir(parents=True)
ds = yaml.safe_load(Path({str(ROOT / 'config/datasets/synth.yaml')!r}).read_text())
ds.update(root=str(root / "data"), annotations=str(root / "data" / "dataset_synth.json"),
          images=str(root / "data" / "images"),
          generate={{"seed": 0, "n_train": 48, "n_val": 12, "n_test": 12, "image_size": 64}})
(cfg_dir / "datasets" / "synth.yaml").write_text(yaml.safe_dump(ds))
(cfg_dir / "backbones.yaml").write_text(yaml.safe_dump(
    {{"efficientnet_lite0": {{"name": "efficientnet_lite0", "input_size": 64, "batch_size": 16}}}}))
generate_synth(ds["root"], progress=False, captions_per_image=5, **ds["generate"])
dcfg, bcfg = load_dataset_config("synth", cfg_dir), load_backbone_config("efficientnet_lite0", cfg_dir)
for split in ("train", "val", "test"):
    extract_features(load_split(dcfg, split), bcfg, root / "features" / "synth" / "efficientnet_lite0" / f"{{split}}.h5",
                     batch_size=16, workers=0, progress=False, threads=1)
"""
    run([python, "-c", code], pythonpath, "building the toy set")


def write_recipe(root: Path, name: str, epochs: int) -> Path:
    method, sections = RECIPES[name]
    doc = {"extends": str(ROOT / "config" / "methods" / f"{method}.yaml"), "dataset": "synth",
           "features": {"backbone": "efficientnet_lite0", "dir": str(root / "features")},
           "model": {"embed_dim": 32}, "text": {"word_vectors": None, "word_dim": 16},
           "train": {"epochs": epochs, "batch_size": 16, "val_max_images": 12, "threads": 1},
           "eval": {"batch_size": 32}, "tracking": {"enabled": False}}
    for key, section in sections.items():
        doc[key] = {**doc.get(key, {}), **section}
    path = root / "config" / "recipes" / "synth" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def run(cmd: list[str], pythonpath: Path, what: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode:
        sys.exit(f"check_identity: {what} failed ({pythonpath}): {(done.stderr.strip() or done.stdout).splitlines()[-1]}")


def train_and_score(recipe: Path, out: Path, python: str, pythonpath: Path) -> dict:
    run([python, "-m", "xmr", "train", "--config", str(recipe), "--out-dir", str(out), "--no-resume",
         "--no-progress"], pythonpath, f"training {recipe.stem}")
    run([python, "-m", "xmr", "score", "--run", str(out), "--out", str(out / "test_sims.npy"), "--no-progress"],
        pythonpath, f"scoring {recipe.stem}")
    history = json.loads((out / "train.json").read_text())["history"]
    history = [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in history]
    return {"history": history, "test_sims_sha256": hashlib.sha256((out / "test_sims.npy").read_bytes()).hexdigest()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the commit to compare with (e.g. HEAD~1)")
    ap.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args()
    found = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "--verify", "--quiet",
                            f"{args.base}^{{commit}}"], capture_output=True, text=True)
    if found.returncode:
        sys.exit(f"check_identity: --base {args.base}: not a commit of {ROOT}; name one (e.g. HEAD~1, a hash)")
    base = found.stdout.strip()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    if subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                      text=True, check=True).stdout.strip():
        head += "+changes"  # the working tree is what was compared
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tmp / "base"), base],
                       capture_output=True, check=True)
        try:
            build_toy_set(tmp / "toy", sys.executable, ROOT)
            print(f"| recipe | same history ({args.epochs} epochs) | same test matrix |")
            print("|---|---|---|")
            for name in args.recipes:
                recipe = write_recipe(tmp / "toy", name, args.epochs)
                new = train_and_score(recipe, tmp / "new" / name, sys.executable, ROOT)
                old = train_and_score(recipe, tmp / "old" / name, sys.executable, tmp / "base")
                row = {"recipe": name, "same_history": new["history"] == old["history"],
                       "same_test_matrix": new["test_sims_sha256"] == old["test_sims_sha256"],
                       "epochs": len(new["history"]), "val_rsum": [r.get("val_rsum") for r in new["history"]]}
                rows.append(row)
                print(f"| {name} | {'yes' if row['same_history'] else 'NO'} | "
                      f"{'yes' if row['same_test_matrix'] else 'NO'} |", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tmp / "base")],
                           capture_output=True)
    if args.json:
        meta = {"base": base, "head": head, "epochs": args.epochs, "cpus": os.cpu_count(),
                "python": platform.python_version(), "machine": platform.processor() or platform.machine()}
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    sys.exit(0 if all(r["same_history"] and r["same_test_matrix"] for r in rows) else 1)


if __name__ == "__main__":
    main()
