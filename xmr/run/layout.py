"""The run-key module: the one owner of run and result paths and of the target grammar (the Snakemake rules,
experiments, the benchmark, the report and ``xmr doctor`` ask it; nothing else builds these paths):

- a run is named by a :class:`RunKey` (dataset, kind, name, variant, seed):

  ====================  ==========================================  ================================================
  kind                  run directory                               results file(s)
  ====================  ==========================================  ================================================
  ``recipe``            ``runs/{dataset}/{recipe}/``                ``results/{dataset}/{recipe}[_{reranker}].json``
  ``experiment``        ``runs/{dataset}/exp/{experiment}/{var}/``  ``results/{dataset}/exp/{experiment}/{var}[_{rr}].json``
  ``benchmark``         ``runs/{dataset}/bench/{bench}/{var}/s{N}/``  ``results/{dataset}/bench/{bench}/{var}/s{N}.json``
  ====================  ==========================================  ================================================

  (an imported checkpoint is a recipe whose config names ``checkpoint:``); :meth:`RunKey.parse_run` and
  :meth:`RunKey.from_run_dir` read run paths back (results paths:
  :func:`xmr.planning.workflow_inputs.parse_result`; a run's config: :func:`xmr.planning.workflow_inputs.run_config`);
- recipes ``config/recipes/{dataset}/{recipe}.yaml``, method defaults ``config/methods/{method}.yaml``;
- features ``{features.dir}/{dataset}/{backbone}/{split}.h5``;
- in a run directory: ``best.pt``, ``last.pt``, ``config.yaml``, ``test_sims.npy``, ``gallery_{split}.npz`` (the
  embeddings cache of ``xmr score``), ``train.lock`` (its one writer, :mod:`xmr.run.lock`).

Name lists (methods, re-rankers) are read from the registries, never repeated here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from xmr.core.errors import XmrError, shown_path
from xmr.settings.run_settings import feature_file  # noqa: F401 - feature files: named in xmr.settings.run_settings

RUNS_ROOT = "runs"
RESULTS_ROOT = "results"
PLAIN = "none"  # the re-ranker entry meaning "no re-ranking"


def reranker_names() -> list[str]:
    """Registered re-rankers (the suffixes of the target grammar)."""
    from xmr.rerank import RERANKERS

    return RERANKERS.names()


def method_config_path(method: str, config_dir: str | Path = "config") -> Path:
    return Path(config_dir) / "methods" / f"{method}.yaml"


def run_dir(dataset: str, recipe: str, runs_root: str | os.PathLike = RUNS_ROOT) -> Path:
    """``runs/{dataset}/{recipe}`` (a recipe's run; :class:`RunKey` for the others)."""
    return RunKey.recipe(dataset, recipe).run_dir(runs_root)


def results_dir(dataset: str, results_root: str | os.PathLike = RESULTS_ROOT, experiment: str | None = None) -> Path:
    """``results/{dataset}/`` (tables of a dataset: summary, benchmark), or an experiment's
    ``results/{dataset}/exp/{experiment}/`` (its table, figure and variants' results)."""
    root = Path(results_root) / dataset
    return root / RUN_KINDS["experiment"] / experiment if experiment else root


def fr_grid_dir(dataset: str, recipe: str, split: str, results_root: str | os.PathLike = RESULTS_ROOT) -> Path:
    """``results/{dataset}/fr_grid/{recipe}/{split}/``: FR's gamma x lambda grid of a run (rule ``fr_grid``)."""
    return Path(results_root) / dataset / "fr_grid" / recipe / split


def tracked_result_name(run_name: str, tag: str) -> str:
    """The name of a results file among its run's MLflow artifacts: ``results/{run name}_{tag}.json``."""
    return f"{RESULTS_ROOT}/{run_name}_{tag}.json"


def gallery_cache_file(run_dir: str | os.PathLike, split: str) -> Path:
    """``runs/{dataset}/{recipe}/gallery_{split}.npz``: the run's cached embeddings of a split
    (xmr.run.gallery_cache)."""
    return Path(run_dir) / f"gallery_{split}.npz"


def target_name(recipe: str, reranker: str | None = None) -> str:
    """The inverse of :func:`parse_target`: ``dvse`` + ``fr`` -> ``dvse_fr``."""
    return f"{recipe}_{reranker}" if reranker else recipe


def result_path(dataset: str, recipe: str, reranker: str | None = None,
                results_root: str | os.PathLike = RESULTS_ROOT) -> Path:
    """``results/{dataset}/{recipe}[_{reranker}].json``."""
    return RunKey.recipe(dataset, recipe).result_path(reranker, results_root)


#: the run-key kinds and the folder that holds each under ``runs/{dataset}/`` and ``results/{dataset}/``
RUN_KINDS = {"recipe": "", "experiment": "exp", "benchmark": "bench"}
#: the ``{run}`` wildcard of the workflow: ``{recipe}``, ``exp/{experiment}/{variant}``, ``bench/{bench}/{variant}/s{seed}``
_NAME = "[a-z0-9_]+"
RUN_PATTERN = f"{_NAME}|exp/{_NAME}/{_NAME}|bench/{_NAME}/{_NAME}/s[0-9]+"


def run_pattern(config_dir: str | Path = "config") -> str:
    """:data:`RUN_PATTERN` less the ensembles' names (``config/ensembles/*/{name}.yaml``): an ensemble's run
    directory is written by rule ``ensemble``, never trained or scored."""
    import re

    names = sorted({p.stem for p in (Path(config_dir) / "ensembles").glob("*/*.yaml")})
    if not names:
        return RUN_PATTERN
    # not followed by a name character, rather than `$`: Snakemake matches the pattern inside the whole path
    return f"(?!(?:{'|'.join(re.escape(n) for n in names)})(?![a-z0-9_])){RUN_PATTERN}"


def split_results_target(target: str | os.PathLike, results_root: str | os.PathLike = RESULTS_ROOT
                         ) -> tuple[str, str] | None:
    """``results/{dataset}/{result}.json`` -> (dataset, result); None for any other path."""
    import re

    m = re.fullmatch(rf"{re.escape(str(results_root))}/([a-z0-9]+)/(.+)\.json", str(target))
    return (m.group(1), m.group(2)) if m else None


def split_experiment_table_target(target: str | os.PathLike, results_root: str | os.PathLike = RESULTS_ROOT
                                  ) -> tuple[str, str] | None:
    """``results/{dataset}/exp/{experiment}/table.md`` -> (dataset, experiment); None for any other path."""
    import re

    m = re.fullmatch(rf"{re.escape(str(results_root))}/([a-z0-9]+)/exp/([a-z0-9_]+)/table\.md", str(target))
    return (m.group(1), m.group(2)) if m else None


def results_target_file(target: str | os.PathLike, results_root: str | os.PathLike = RESULTS_ROOT) -> Path | None:
    """Where a ``results/...`` target lies under ``results_root`` (another folder than ``results`` in tests);
    None for a target outside ``results/``."""
    rel = Path(target)
    if not rel.parts or rel.parts[0] != RESULTS_ROOT:
        return None
    return Path(results_root).joinpath(*rel.parts[1:])


def result_pattern(tables: tuple[str, ...] = ("summary",), config_dir: str | Path = "config") -> str:
    """The ``{result}`` wildcard of ``results/{dataset}/{result}.json``: a recipe target, an experiment variant's
    or a benchmark run's, but never a dataset-level table (``summary``, ``{benchmark}``: other rules write those)."""
    names = [*tables, *sorted(p.stem for p in (Path(config_dir) / "benchmark").glob("*.yaml"))]
    not_table = "(?!(?:" + "|".join(names) + ")$)"
    return f"{not_table}{_NAME}|exp/{_NAME}/{_NAME}|bench/{_NAME}/{_NAME}/s[0-9]+"


@dataclass(frozen=True)
class RunKey:
    """One training run: a recipe, a variant of an experiment, or a variant x seed of a benchmark."""

    dataset: str
    name: str  # the recipe, experiment or benchmark name
    kind: str = "recipe"
    variant: str | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in RUN_KINDS:
            raise XmrError(f"run kind {self.kind!r}: choose one of {', '.join(RUN_KINDS)}")
        if (self.kind == "recipe") != (self.variant is None) or (self.kind == "benchmark") != (self.seed is not None):
            raise XmrError(f"run key {self}: a recipe has no variant, an experiment a variant, a benchmark a "
                           f"variant and a seed")

    @classmethod
    def recipe(cls, dataset: str, recipe: str) -> "RunKey":
        return cls(dataset, recipe)

    @classmethod
    def experiment(cls, dataset: str, experiment: str, variant: str) -> "RunKey":
        return cls(dataset, experiment, "experiment", variant)

    @classmethod
    def benchmark(cls, dataset: str, bench: str, variant: str, seed: int) -> "RunKey":
        return cls(dataset, bench, "benchmark", variant, int(seed))

    # -- paths ----------------------------------------------------------------------------------------------------
    @property
    def run(self) -> str:
        """The ``{run}`` wildcard value: the run directory below ``runs/{dataset}/``."""
        if self.kind == "recipe":
            return self.name
        if self.kind == "experiment":
            return f"exp/{self.name}/{self.variant}"
        return f"bench/{self.name}/{self.variant}/s{self.seed}"

    def run_dir(self, runs_root: str | os.PathLike = RUNS_ROOT) -> Path:
        return Path(runs_root) / self.dataset / self.run

    def result_path(self, reranker: str | None = None, results_root: str | os.PathLike = RESULTS_ROOT) -> Path:
        """The results file of this run with ``reranker`` (None or ``none``: plain). A benchmark run has one
        file holding every re-ranker of its benchmark."""
        reranker = None if reranker in (None, PLAIN) else reranker
        root = Path(results_root) / self.dataset
        if self.kind == "benchmark":
            return root / "bench" / self.name / self.variant / f"s{self.seed}.json"
        if self.kind == "experiment":
            return root / "exp" / self.name / f"{target_name(self.variant, reranker)}.json"
        return root / f"{target_name(self.name, reranker)}.json"

    @classmethod
    def parse_run(cls, dataset: str, run: str) -> "RunKey":
        """The inverse of :attr:`run`."""
        parts = run.strip("/").split("/")
        if len(parts) == 1 and parts[0]:
            return cls.recipe(dataset, parts[0])
        if len(parts) == 3 and parts[0] == "exp":
            return cls.experiment(dataset, parts[1], parts[2])
        if len(parts) == 4 and parts[0] == "bench" and parts[3][:1] == "s" and parts[3][1:].isdigit():
            return cls.benchmark(dataset, parts[1], parts[2], int(parts[3][1:]))
        raise XmrError(f"runs/{dataset}/{run}: not a run directory of this layout ({{recipe}}, "
                       f"exp/{{experiment}}/{{variant}} or bench/{{benchmark}}/{{variant}}/s{{seed}})")

    @classmethod
    def from_run_dir(cls, path: str | os.PathLike, runs_root: str | os.PathLike = RUNS_ROOT) -> "RunKey":
        """``runs/{dataset}/{run}`` (relative to the working directory, or absolute below it) -> its key."""
        p, root = Path(path), Path(runs_root)
        try:
            rel = p.resolve().relative_to(root.resolve()) if p.is_absolute() else p.relative_to(root)
        except ValueError:
            raise XmrError(f"{path}: not under {runs_root}/; name a run directory runs/{{dataset}}/... "
                           f"(or give --config FILE --out-dir DIR)") from None
        if len(rel.parts) < 2:
            raise XmrError(f"{path}: not a run directory runs/{{dataset}}/{{run}}")
        return cls.parse_run(rel.parts[0], "/".join(rel.parts[1:]))


def parse_target(dataset: str, target: str, config_dir: str | Path = "config") -> tuple[str, str | None]:
    """``results/{dataset}/{target}.json`` -> (recipe, reranker): ``dvse_fr`` is recipe ``dvse`` + FR unless a
    recipe file is literally called ``dvse_fr``."""
    recipes = Path(config_dir) / "recipes" / dataset
    # an ensemble (config/ensembles/{dataset}/{name}.yaml, xmr.studies.ensembles) is a target like a recipe
    ensembles = Path(config_dir) / "ensembles" / dataset

    def named(name: str) -> bool:
        return (recipes / f"{name}.yaml").exists() or (ensembles / f"{name}.yaml").exists()

    if named(target):
        return target, None
    rerankers = reranker_names()
    for suffix in sorted(rerankers, key=len, reverse=True):  # the longest first: dvse_fr_val is dvse + fr_val
        base = target[:-len(suffix) - 1]
        if target.endswith(f"_{suffix}") and named(base):
            return base, suffix
    known = sorted(p.stem for p in recipes.glob("*.yaml"))
    ens = sorted(p.stem for p in ensembles.glob("*.yaml"))
    raise XmrError(f"no recipe for results/{dataset}/{target}.json: expected {shown_path(recipes / (target + '.yaml'))} "
                   f"(recipes for {dataset}: {', '.join(known) or 'none'}"
                   + (f"; ensembles: {', '.join(ens)}" if ens else "")
                   + f"; re-ranker suffixes: {', '.join(rerankers)})")


def recipe_path(dataset: str, recipe: str, config_dir: str | Path = "config") -> str:
    return str(Path(config_dir) / "recipes" / dataset / f"{recipe}.yaml")
