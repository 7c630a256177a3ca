"""Sweeps and ablations as data: ``config/experiments/{name}.yaml`` (schema ``xmr/schemas/experiment.schema.yaml``).

Two kinds of experiment:

- **variants of one recipe** (``recipe`` + ``variants`` and/or ``sweep``): each variant is the recipe with config
  overrides, trained into ``runs/{dataset}/exp/{name}/{variant}/`` and evaluated into
  ``results/{dataset}/exp/{name}/{variant}[_{reranker}].json``;
  A variant whose run would be a benchmark's (``runs_from``: the same recipe, overrides and seed) takes that run
  instead of training it again: a ladder's last rung is its method's seed-0 benchmark run;
- **a comparison of recipes** (``recipes``): the existing targets ``results/{dataset}/{recipe}[_{reranker}].json``
  (no retraining), e.g. every method x every re-ranker.

Either way the experiment is a grid variant x re-ranker of results files, gathered by
:func:`xmr.report.experiment_table.write_experiment_table` into ``table.md``/``table.csv``/``figure.png``.
Paths are relative to the working directory (the repository root, as for every Snakemake rule).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from xmr.core.errors import XmrError
from xmr.run.layout import PLAIN, RESULTS_ROOT, RUNS_ROOT, RunKey, results_dir


def rerankers() -> list[str]:
    """Registered re-ranker names (the suffixes a results target may carry)."""
    from xmr.rerank import RERANKERS

    return list(RERANKERS.names())


def format_value(value: Any) -> str:
    """A swept value as part of a variant name: ``0.2`` -> ``0p2``, ``-1`` -> ``m1``, ``1.0`` -> ``1``."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).replace("-", "m").replace(".", "p").replace("+", "")


@dataclass
class Experiment:
    """A loaded, validated experiment file."""

    name: str
    path: Path
    doc: dict
    datasets: list[str]
    rerank: list[str]
    variants: dict[str, dict[str, Any]]  # variant -> overrides (KEY.PATH -> value), in file order
    recipe: str | None = None  # variants kind: the base recipe; None for the recipes kind
    sweep: dict | None = None
    sweep_values: dict[str, Any] = field(default_factory=dict)  # variant -> swept value (sweep variants only)
    config_dir: Path = Path("config")  # where its recipes live (the config/ folder holding experiments/)
    runs_from: list[str] = field(default_factory=list)  # benchmarks whose runs an identical variant reuses

    @property
    def kind(self) -> str:
        return "variants" if self.recipe else "recipes"

    @property
    def figure_kind(self) -> str:
        kind = self.doc.get("figure", "auto")
        if kind == "auto":
            return "line" if self.sweep else "bar"
        return kind

    @property
    def sweep_label(self) -> str | None:
        if not self.sweep:
            return None
        return self.sweep.get("label") or self.sweep["key"]

    @property
    def common_overrides(self) -> dict[str, Any]:
        return dict(self.doc.get("overrides") or {})

    def check_dataset(self, dataset: str) -> None:
        if dataset not in self.datasets:
            raise XmrError(f"{self.path}: dataset: experiment {self.name!r} is for {', '.join(self.datasets)}, "
                           f"not {dataset!r}; add {dataset!r} to its `dataset` list to run it there")

    def check_variant(self, variant: str) -> None:
        if variant not in self.variants:
            raise XmrError(f"{self.path}: no variant {variant!r}; variants: {', '.join(self.variants)}")

    def recipe_of(self, variant: str) -> str:
        self.check_variant(variant)
        return self.recipe or variant

    def overrides_of(self, variant: str) -> dict[str, Any]:
        """Common overrides, then the variant's own (the variant wins)."""
        self.check_variant(variant)
        return {**self.common_overrides, **self.variants[variant]}

    def run_name(self, variant: str) -> str:
        """The run config's ``name`` (MLflow run name, ``recipe`` field of results files)."""
        return f"{self.name}.{variant}" if self.recipe else variant

    def run_key(self, dataset: str, variant: str) -> RunKey:
        """The run a variant's results come from: a variant of a recipe is an experiment run, or the ``runs_from``
        benchmark's run it would duplicate; a comparison's variant is the recipe's own run."""
        shared = self.shared_runs(dataset).get(variant)
        return shared or self._own_key(dataset, variant)

    def _own_key(self, dataset: str, variant: str) -> RunKey:
        self.check_variant(variant)
        return RunKey.experiment(dataset, self.name, variant) if self.recipe else RunKey.recipe(dataset, variant)

    def shared_runs(self, dataset: str) -> dict[str, RunKey]:
        """variant -> the benchmark run (``runs_from``) trained with exactly the variant's run config (the same
        recipe, overrides and seed; only ``name`` and ``description`` differ), which it reuses."""
        if not self.runs_from or not self.recipe:
            return {}
        return dict(_shared_runs(str(self.path.resolve()), str(Path(self.config_dir).resolve()), dataset))

    def run_dir(self, dataset: str, variant: str, runs_root: str | os.PathLike = RUNS_ROOT) -> Path:
        return self.run_key(dataset, variant).run_dir(runs_root)

    def results_dir(self, dataset: str, results_root: str | os.PathLike = RESULTS_ROOT) -> Path:
        """Where the table and figure go (and, for the variants kind, the results files)."""
        return results_dir(dataset, results_root, experiment=self.name)

    def result_path(self, dataset: str, variant: str, rerank: str = PLAIN,
                    results_root: str | os.PathLike = RESULTS_ROOT) -> Path:
        return self._own_key(dataset, variant).result_path(rerank, results_root)  # its own, even for a shared run

    def variants_for(self, dataset: str, config_dir: str | os.PathLike | None = None) -> list[str]:
        """Variants that exist on ``dataset``: all of them for a sweep; for a comparison of recipes, the recipes
        with a file ``config/recipes/{dataset}/{recipe}.yaml`` or ``config/ensembles/{dataset}/{recipe}.yaml`` (the
        others are left out of its table)."""
        if self.recipe:
            return list(self.variants)
        cdir = Path(config_dir or self.config_dir)
        # a recipe, or an ensemble of recipes (config/ensembles/, xmr.studies.ensembles): the same kind of target
        return [v for v in self.variants if (cdir / "recipes" / dataset / f"{v}.yaml").exists()
                or (cdir / "ensembles" / dataset / f"{v}.yaml").exists()]

    def targets(self, dataset: str, results_root: str | os.PathLike = RESULTS_ROOT,
                config_dir: str | os.PathLike | None = None) -> list[tuple[str, str, Path]]:
        """Every (variant, rerank, results path) of the experiment on ``dataset``, variants in file order."""
        return [(v, r, self.result_path(dataset, v, r, results_root)) for v in self.variants_for(dataset, config_dir)
                for r in self.rerank]

    def parse_target(self, target: str) -> tuple[str, str | None]:
        """``results/{dataset}/exp/{name}/{target}.json`` -> (variant, reranker or None)."""
        if target in self.variants:
            return target, None
        base, _, suffix = target.rpartition("_")
        if base in self.variants and suffix in self.rerank and suffix != PLAIN:
            return base, suffix
        raise XmrError(f"{self.path}: no variant/re-ranker target {target!r} in experiment {self.name!r}; "
                       f"variants: {', '.join(self.variants)}; re-rankers: {', '.join(self.rerank)}")

    def sweep_value(self, variant: str) -> Any:
        """The swept value of ``variant`` (sweep variants, or explicit variants that set the swept key)."""
        if variant in self.sweep_values:
            return self.sweep_values[variant]
        if self.sweep and self.sweep["key"] in self.overrides_of(variant):
            return self.overrides_of(variant)[self.sweep["key"]]
        return None


def experiment_path(name_or_path: str | os.PathLike, config_dir: str | os.PathLike = "config") -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml"):
        return p
    return Path(config_dir) / "experiments" / f"{name_or_path}.yaml"


def list_experiments(config_dir: str | os.PathLike = "config", dataset: str | None = None) -> list[Experiment]:
    """Every experiment file under ``config/experiments/`` (those for ``dataset`` when given), sorted by name."""
    out = []
    for p in sorted((Path(config_dir) / "experiments").glob("*.yaml")):
        exp = load_experiment(p, config_dir)
        if dataset is None or dataset in exp.datasets:
            out.append(exp)
    return out


def load_experiment(name_or_path: str | os.PathLike, config_dir: str | os.PathLike | None = None) -> Experiment:
    """Load and validate an experiment file (by path, or by name under ``config/experiments/``).

    Its recipes are looked up in ``config_dir``; by default the ``config/`` folder holding the file's
    ``experiments/`` folder (else ``./config``)."""
    from xmr.config.loader import load_validated

    path = experiment_path(name_or_path, config_dir or "config")
    if config_dir is None:
        config_dir = path.parent.parent if path.parent.name == "experiments" else Path("config")
    if not path.exists():
        known = sorted(p.stem for p in (Path(config_dir) / "experiments").glob("*.yaml"))
        raise XmrError(f"{path}: experiment file not found (experiments: {', '.join(known) or 'none'})")
    doc = load_validated(path, "experiment")
    src = str(path)
    if doc["name"] != path.stem:
        raise XmrError(f"{src}: name: {doc['name']!r} must equal the file name {path.stem!r}")
    known_rerankers = rerankers()
    for r in doc["rerank"]:
        if r != PLAIN and r not in known_rerankers:
            raise XmrError(f"{src}: rerank: unknown re-ranker {r!r}; choose from {PLAIN}, {', '.join(known_rerankers)}")
    datasets = [doc["dataset"]] if isinstance(doc["dataset"], str) else list(doc["dataset"])

    if "recipes" in doc:
        for key in ("recipe", "variants", "sweep", "overrides", "runs_from"):
            if key in doc:
                raise XmrError(f"{src}: {key}: not allowed with `recipes` (a comparison of existing recipes is "
                               f"not retrained); use `recipe` + `variants`/`sweep` for a sweep")
        variants = {r: {} for r in doc["recipes"]}
        exp = Experiment(doc["name"], path, doc, datasets, list(doc["rerank"]), variants, config_dir=Path(config_dir))
    else:
        if "recipe" not in doc:
            raise XmrError(f"{src}: missing required key 'recipe' (or give `recipes` to compare existing recipes)")
        if "variants" not in doc and "sweep" not in doc:
            raise XmrError(f"{src}: missing required key 'variants' (or a `sweep`)")
        variants: dict[str, dict[str, Any]] = {}
        sweep_values: dict[str, Any] = {}
        sweep = doc.get("sweep")
        if sweep:
            prefix = sweep.get("prefix") or sweep["key"].rsplit(".", 1)[-1].lower()
            for value in sweep["values"]:
                name = f"{prefix}_{format_value(value)}"
                if name in variants:
                    raise XmrError(f"{src}: sweep.values: {value!r} gives the same variant name {name!r} as an "
                                   f"earlier value")
                variants[name] = {sweep["key"]: value}
                sweep_values[name] = value
        for name, over in (doc.get("variants") or {}).items():
            if name in variants:
                raise XmrError(f"{src}: variants.{name}: the sweep already makes a variant of that name")
            variants[name] = dict(over or {})
        exp = Experiment(doc["name"], path, doc, datasets, list(doc["rerank"]), variants, doc["recipe"], sweep,
                         sweep_values, Path(config_dir), list(doc.get("runs_from") or []))
        for name in exp.runs_from:
            bpath = Path(config_dir) / "benchmark" / f"{name}.yaml"
            if not bpath.exists():
                known = sorted(p.stem for p in (Path(config_dir) / "benchmark").glob("*.yaml"))
                raise XmrError(f"{src}: runs_from: no benchmark {name!r} ({bpath} not found; benchmarks: "
                               f"{', '.join(known) or 'none'})")
    for name in exp.variants:
        base, _, suffix = name.rpartition("_")
        if base and suffix in known_rerankers:
            raise XmrError(f"{src}: variant {name!r} ends in a re-ranker suffix (_{suffix}); its results file "
                           f"would be ambiguous: rename it")
    return exp


def _override_strings(overrides: dict[str, Any]) -> list[str]:
    # JSON is valid YAML, so apply_overrides parses each value back to what the experiment file said
    return [f"{k}={json.dumps(v)}" for k, v in overrides.items()]


def _has_key(cfg: dict, dotted: str) -> bool:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def resolve_variant(exp: Experiment, variant: str, dataset: str | None = None,
                    config_dir: str | os.PathLike | None = None, extra: Sequence[str] = ()) -> dict:
    """The validated run config of ``variant``: its recipe for ``dataset`` with the experiment's overrides (then
    ``extra`` ``KEY.PATH=VALUE`` strings, e.g. ``xmr train --set``).

    Every override key must exist in the recipe's resolved config (a misspelt key would silently sweep nothing).
    """
    from xmr.run.config import load_run_config
    from xmr.run.layout import recipe_path

    dataset = dataset or exp.datasets[0]
    exp.check_dataset(dataset)
    exp.check_variant(variant)
    recipe = exp.recipe_of(variant)
    rpath = recipe_path(dataset, recipe, config_dir or exp.config_dir)
    if not Path(rpath).exists():
        raise XmrError(f"{exp.path}: recipe{'s' if exp.kind == 'recipes' else ''}: no recipe {rpath}")
    if exp.kind == "recipes":
        return load_run_config(rpath, user_set=extra)
    base = load_run_config(rpath)
    for where, over in (("overrides", exp.common_overrides), (f"variants.{variant}", exp.variants[variant])):
        for key in over:
            if not _has_key(base, key):
                raise XmrError(f"{exp.path}: {where}: key {key!r} is not in the resolved config of {rpath}; "
                               f"check the option name in config/methods/{base['method']}.yaml")
    overrides = _override_strings(exp.overrides_of(variant)) + [f"name={json.dumps(exp.run_name(variant))}"]
    desc = ", ".join(f"{k}={json.dumps(v)}" for k, v in exp.overrides_of(variant).items()) or "recipe as is"
    overrides.append(f"description={json.dumps(f'experiment {exp.name}, variant {variant}: {desc}')}")
    return load_run_config(rpath, overrides, user_set=extra)


# a run config's keys that name or describe the run without changing what it trains
_LABEL_KEYS = ("name", "description")


@functools.lru_cache(maxsize=None)
def _shared_runs(path: str, config_dir: str, dataset: str) -> tuple[tuple[str, RunKey], ...]:
    """:meth:`Experiment.shared_runs`, once per experiment file and dataset in a process (the workflow asks for
    every results target). A candidate must have the same recipe and the same merged overrides; the resolved run
    configs are then compared whole, so that a match is the same training, not the same-looking one."""
    from xmr.run.config import load_run_config
    from xmr.studies.benchmark import load_benchmark

    exp = load_experiment(path, config_dir)
    found: dict[str, RunKey] = {}
    for name in exp.runs_from:
        bench = load_benchmark(Path(config_dir) / "benchmark" / f"{name}.yaml", config_dir)
        if bench.dataset != dataset or dataset not in exp.datasets:
            continue
        for variant in exp.variants:
            if variant in found:
                continue
            for bv, spec in bench.variants.items():
                if spec["recipe"] != exp.recipe or bench.overrides_of(bv) != exp.overrides_of(variant):
                    continue
                mine = resolve_variant(exp, variant, dataset)
                seed = mine["train"]["seed"]
                if seed not in bench.seeds:
                    continue
                theirs = load_run_config(bench.recipe_path(bv), bench.train_overrides(bv, seed))
                if all(mine.get(k) == theirs.get(k) for k in set(mine) | set(theirs) if k not in _LABEL_KEYS):
                    found[variant] = bench.run_key(bv, seed)
                    break
    return tuple(found.items())


__all__ = ["Experiment", "PLAIN", "load_experiment", "list_experiments", "resolve_variant", "experiment_path",
           "format_value", "rerankers"]
