"""Ensembles as data: ``config/ensembles/{dataset}/{name}.yaml`` (schema ``xmr/schemas/ensemble.schema.yaml``).

An ensemble averages the similarity matrices of trained runs of the same dataset (its ``members``, recipe names of
``config/recipes/{dataset}/``), optionally weighted: S = sum_i w_i S_i / sum_i w_i. It is evaluated exactly like a
recipe: ``xmr ensemble`` writes the run directory ``runs/{dataset}/{name}/`` (the mean ``test_sims.npy``, and the
mean QB-Norm bank matrices when asked for them, with the first member's ``config.yaml`` renamed), and ``xmr test``
evaluates it into ``results/{dataset}/{name}[_{reranker}].json``: every protocol, any re-ranker after the mean.

The mean streams: one member's matrix is memory-mapped at a time and added block of rows by block of rows into one
float32 accumulator, so memory holds the output and one block, never every member's matrix at once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from xmr.core.errors import XmrError
from xmr.run.layout import RUNS_ROOT, RunKey

#: the matrices of a run directory an ensemble averages: the test matrix (rule score) and QB-Norm's query bank
#: (rule score_bank), so that every re-ranker runs after the mean
MATRICES = ("test_sims", "qbnorm_bank_i2t", "qbnorm_bank_t2i")
#: rows added per step (a COCO-5K row of 25,000 captions is 100 KB: 512 rows are 50 MB)
BLOCK_ROWS = 512


@dataclass(frozen=True)
class Ensemble:
    """A loaded, validated ensemble file."""

    name: str
    dataset: str
    path: Path
    members: tuple[str, ...]
    weights: tuple[float, ...]
    source: str | None = None

    def member_dirs(self, runs_root: str | os.PathLike = RUNS_ROOT) -> list[Path]:
        return [RunKey.recipe(self.dataset, m).run_dir(runs_root) for m in self.members]


def ensembles_dir(dataset: str, config_dir: str | os.PathLike = "config") -> Path:
    return Path(config_dir) / "ensembles" / dataset


def ensemble_path(dataset: str, name: str, config_dir: str | os.PathLike = "config") -> Path:
    return ensembles_dir(dataset, config_dir) / f"{name}.yaml"


def is_ensemble(dataset: str, name: str, config_dir: str | os.PathLike = "config") -> bool:
    return ensemble_path(dataset, name, config_dir).is_file()


def list_ensembles(config_dir: str | os.PathLike = "config") -> list[tuple[str, str]]:
    """Every ``(dataset, name)`` of ``config/ensembles/``."""
    root = Path(config_dir) / "ensembles"
    return sorted((p.parent.name, p.stem) for p in root.glob("*/*.yaml"))


def ensemble_pattern(config_dir: str | os.PathLike = "config") -> str:
    """The ``{ensemble}`` wildcard of rule ``ensemble``: exactly the ensemble names (none: nothing)."""
    import re

    names = sorted({n for _, n in list_ensembles(config_dir)})
    return "|".join(re.escape(n) for n in names) if names else "(?!)"


def load_ensemble(dataset: str, name: str, config_dir: str | os.PathLike = "config") -> Ensemble:
    """The ensemble ``config/ensembles/{dataset}/{name}.yaml``, validated: its members are recipes of the dataset,
    its name is no recipe's, one weight per member."""
    from xmr.config.loader import load_validated
    from xmr.run.layout import recipe_path

    path = ensemble_path(dataset, name, config_dir)
    if not path.is_file():
        known = ", ".join(n for d, n in list_ensembles(config_dir) if d == dataset) or "none"
        raise XmrError(f"{path}: no such ensemble (ensembles of {dataset}: {known})")
    doc = load_validated(path, "ensemble")
    clash = sorted(Path(config_dir).glob(f"recipes/*/{name}.yaml"))
    if clash:  # the workflow tells an ensemble's run directory from a recipe's by its name alone
        raise XmrError(f"{path}: {clash[0]} has the same name; give the ensemble a name no recipe has")
    for m in doc["members"]:
        if not Path(recipe_path(dataset, m, config_dir)).exists():
            raise XmrError(f"{path}: members: no recipe {recipe_path(dataset, m, config_dir)}; name recipes of "
                           f"config/recipes/{dataset}/")
    weights = doc.get("weights") or [1.0] * len(doc["members"])
    if len(weights) != len(doc["members"]):
        raise XmrError(f"{path}: weights: {len(weights)} weights for {len(doc['members'])} members; give one "
                       f"per member")
    return Ensemble(name, dataset, path, tuple(doc["members"]), tuple(float(w) for w in weights),
                    doc.get("source"))


def mean_matrix(paths: Sequence[str | os.PathLike], out: str | os.PathLike,
                weights: Sequence[float] | None = None, block_rows: int = BLOCK_ROWS,
                progress: bool | None = None) -> np.ndarray:
    """``sum_i w_i S_i / sum_i w_i`` of the ``.npy`` matrices ``paths`` (equal weights by default), written to
    ``out`` (float32, atomically) and returned. Member by member, ``block_rows`` rows at a time from a
    memory-mapped file, into one float32 accumulator; ``progress``: a bar over the members (False: log lines)."""
    from xmr.core.io import atomic_path, load_array
    from xmr.core.progress import bar

    if len(paths) < 2:
        raise XmrError(f"an ensemble needs two matrices or more; got {len(paths)}")
    weights = [1.0] * len(paths) if weights is None else [float(w) for w in weights]
    if len(weights) != len(paths) or any(not w > 0 for w in weights):
        raise XmrError(f"weights {weights}: give one positive weight per matrix ({len(paths)})")
    total = sum(weights)
    # every matrix's shape first (memory-mapped: its header only), so that a bad member fails before any work
    shape = None
    for path in paths:
        s = load_array(path, "similarity matrix", mmap=True)
        if s.ndim != 2:
            raise XmrError(f"{path}: expected a 2-D similarity matrix (images x captions); got shape {s.shape}")
        if shape is not None and s.shape != shape:
            raise XmrError(f"{path}: shape {s.shape} differs from {paths[0]}'s {shape}; an ensemble's members "
                           f"must score the same test split")
        shape = s.shape
        del s
    acc = np.zeros(shape, dtype=np.float32)
    for path, w in bar(list(zip(paths, weights)), desc="ensemble", unit="matrix", progress=progress):
        s = load_array(path, "similarity matrix", mmap=True)
        scale = np.float32(w / total)
        for start in range(0, s.shape[0], block_rows):
            block = np.asarray(s[start:start + block_rows], dtype=np.float32)
            if not np.isfinite(block).all():
                raise XmrError(f"{path}: NaN or inf in rows {start}..{start + len(block) - 1}; rescore that run")
            acc[start:start + block_rows] += scale * block
        del s
    with atomic_path(out, ".npy") as tmp:
        with open(tmp, "wb") as f:
            np.save(f, acc)
    return acc


def build_ensemble(ens: Ensemble, matrix: str = "test_sims", runs_root: str | os.PathLike = RUNS_ROOT,
                   progress: bool | None = None) -> Path:
    """Write ``runs/{dataset}/{name}/{matrix}.npy``, the mean of the members' ``{matrix}.npy``, with the run
    directory's ``config.yaml`` (the first member's, named after the ensemble: the dataset, protocols and
    re-ranker settings ``xmr test`` reads) and ``ensemble.json`` (members and weights). Returns the matrix file."""
    import yaml

    from xmr.core.io import atomic_path, write_json
    from xmr.run.config import SAVED_CONFIG, load_saved_config

    if matrix not in MATRICES:
        raise XmrError(f"matrix {matrix!r}: an ensemble averages {', '.join(MATRICES)}")
    dirs = ens.member_dirs(runs_root)
    paths = [d / f"{matrix}.npy" for d in dirs]
    for m, p in zip(ens.members, paths):
        if not p.is_file():
            raise XmrError(f"{p}: not found; member {m!r} of {ens.path} has no {matrix} matrix yet "
                           f"(`snakemake -c2 {p}`)")
    cfg = load_saved_config(dirs[0])
    for m, d in zip(ens.members[1:], dirs[1:]):
        other = load_saved_config(d)
        if other["dataset_cfg"]["test_split"] != cfg["dataset_cfg"]["test_split"]:
            raise XmrError(f"{d}: member {m!r} was tested on another split than {ens.members[0]!r}")
    out_dir = RunKey.recipe(ens.dataset, ens.name).run_dir(runs_root)
    out = out_dir / f"{matrix}.npy"
    mean_matrix(paths, out, ens.weights, progress=progress)
    cfg["name"] = ens.name
    with atomic_path(out_dir / SAVED_CONFIG, ".yaml") as tmp:
        tmp.write_text(yaml.safe_dump(cfg, sort_keys=False))
    write_json(out_dir / "ensemble.json", {"ensemble": str(ens.path), "members": list(ens.members),
                                           "weights": list(ens.weights), "source": ens.source})
    return out


def ensemble_inputs(dataset: str, name: str, matrix: str, config_dir: str | os.PathLike = "config",
                    runs_root: str | os.PathLike = RUNS_ROOT) -> dict[str, object]:
    """The files rule ``ensemble`` reads for ``runs/{dataset}/{name}/{matrix}.npy``: the ensemble file and each
    member's same matrix."""
    ens = load_ensemble(dataset, name, config_dir)
    return {"ensemble": str(ens.path), "members": [str(d / f"{matrix}.npy") for d in ens.member_dirs(runs_root)]}


__all__ = ["Ensemble", "MATRICES", "load_ensemble", "list_ensembles", "is_ensemble", "ensemble_pattern",
           "mean_matrix", "build_ensemble", "ensemble_inputs"]
