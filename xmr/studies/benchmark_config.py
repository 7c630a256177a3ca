"""A seeded benchmark's file, ``config/benchmark/{name}.yaml`` (schema ``xmr/schemas/benchmark.schema.yaml``), and the
per-seed results of its runs: what both the claims (:mod:`xmr.studies.claims`) and the benchmark's tables
(:mod:`xmr.studies.benchmark`) read.

- **The file.** :class:`Benchmark` (variants, seeds, re-rankers, claims; each run's key, recipe and overrides),
  :func:`load_benchmark` (validated; a ``runs_from`` file's shared variants; the contribution variants, below).
- **What a claim's two sides may differ in.** The protocol (:data:`TRAINED_ALIKE`) and the settings each method
  declares as its own (``config/method_settings.yaml``): :func:`claim_differences`, :func:`check_trained_alike`.
- **Contribution and recipe** (docs/benchmark.md): :func:`add_contribution_claims` judges a claim between two
  recipes against a variant of the claimed-better side trained with the other side's values for all that is not
  its method's contribution.
- **The per-seed results.** :func:`gather`: one record per (variant, seed, re-ranker, subset) with its metrics.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xmr.core.errors import XmrError
from xmr.run.layout import RESULTS_ROOT, RUNS_ROOT, RunKey


PLAIN = "none"
ALL = "all"  # the whole test split (not a subset)
METRICS = ("i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "rsum")
#: mAP@R over extended positives (a results file's ``extended``, synth's scene-checked ones), shown beside RSUM;
#: NaN for a results file without them
EXTENDED_METRICS = ("i2t_map_at_r_ext", "t2i_map_at_r_ext")
#: per-run set statistics a claim can compare (xmr/evaluation/set_stats.py; the same value for every re-ranker and
#: subset of a run: they describe its image embeddings); NaN for a run of a single-embedding method
SET_METRICS = ("correlation", "residual_correlation")
LOWER_IS_BETTER = frozenset(SET_METRICS)  # a claim "X lowers the correlation": the claimed-better side is lower


@dataclass
class Benchmark:
    name: str
    path: Path
    dataset: str
    seeds: list[int]
    rerank: list[str]
    variants: dict[str, dict[str, Any]]
    overrides: dict[str, Any] = field(default_factory=dict)
    claims: list[dict[str, Any]] = field(default_factory=list)
    config_dir: Path = Path("config")
    degenerate_std: float = 0.01  # test similarities with a smaller std: a collapsed run, flagged in the tables
    runs_from: str | None = None  # another benchmark whose runs the same-named, same-defined variants reuse
    shared: frozenset = frozenset()  # those variants (set by load_benchmark)
    smallest_effect: dict[str, float] = field(default_factory=dict)  # per metric: the effect of interest (Δ)
    power: float = 0.8  # of each claim's detectable effect
    query_resamples: int = 2000  # bootstrap resamples of the query-level test

    def check_variant(self, variant: str) -> None:
        if variant not in self.variants:
            raise XmrError(f"{self.path}: no variant {variant!r}; variants: {', '.join(self.variants)}")

    def recipe_path(self, variant: str) -> Path:
        self.check_variant(variant)
        return self.config_dir / "recipes" / self.dataset / f"{self.variants[variant]['recipe']}.yaml"

    def run_key(self, variant: str, seed: int) -> RunKey:
        """The run of (variant, seed): this benchmark's own, or ``runs_from``'s for a shared variant."""
        self.check_variant(variant)
        return RunKey.benchmark(self.dataset, self.runs_from if variant in self.shared else self.name, variant, seed)

    def run_dir(self, variant: str, seed: int, runs_root: str | os.PathLike = RUNS_ROOT) -> Path:
        return self.run_key(variant, seed).run_dir(runs_root)

    def result_path(self, variant: str, seed: int, results_root: str | os.PathLike = RESULTS_ROOT) -> Path:
        return self.run_key(variant, seed).result_path(results_root=results_root)

    def results(self, results_root: str | os.PathLike = RESULTS_ROOT) -> list[Path]:
        return [self.result_path(v, s, results_root) for v in self.variants for s in self.seeds]

    def overrides_of(self, variant: str) -> dict[str, Any]:
        self.check_variant(variant)
        return {**self.overrides, **(self.variants[variant].get("set") or {})}

    def train_overrides(self, variant: str, seed: int) -> list[str]:
        """``--set`` strings for ``xmr train --config {recipe}``: common and variant overrides, the seed, the name."""
        import json

        if seed not in self.seeds:
            raise XmrError(f"{self.path}: seed {seed} is not in seeds {self.seeds}")
        over = {**self.overrides_of(variant), "train.seed": seed, "name": f"{self.name}.{variant}.s{seed}"}
        return [f"{k}={json.dumps(v)}" for k, v in over.items()]

    def run_config(self, variant: str, seed: int) -> dict:
        from xmr.run.config import load_run_config

        return load_run_config(self.recipe_path(variant), self.train_overrides(variant, seed))

    def path_metrics(self) -> list[str]:
        """The claims' metrics given as dotted paths into a results file (``extended.t2i.map_at_r``)."""
        return sorted({c["metric"] for c in self.claims if "." in c["metric"]})

    def label(self, variant: str) -> str:
        v = self.variants[variant]
        if v.get("label"):
            return v["label"]
        over = v.get("set") or {}
        return v["recipe"] + (" (" + ", ".join(f"{k}={val}" for k, val in over.items()) + ")" if over else "")


def benchmark_path(name_or_path: str | os.PathLike, config_dir: str | os.PathLike = "config") -> Path:
    p = Path(name_or_path)
    return p if p.suffix in (".yaml", ".yml") else Path(config_dir) / "benchmark" / f"{name_or_path}.yaml"


def benchmark_names(config_dir: str | os.PathLike = "config") -> list[str]:
    """Names of the benchmark files under ``config/benchmark/`` (the workflow's ``{bench}`` wildcard values)."""
    return sorted(p.stem for p in (Path(config_dir) / "benchmark").glob("*.yaml"))


def load_benchmark(name_or_path: str | os.PathLike, config_dir: str | os.PathLike | None = None) -> Benchmark:
    """Load and validate a benchmark file; its recipes must exist and its claims must name its variants."""
    from xmr.config.loader import load_validated
    from xmr.rerank import RERANKERS

    path = benchmark_path(name_or_path, config_dir or "config")
    if config_dir is None:
        config_dir = path.parent.parent if path.parent.name == "benchmark" else Path("config")
    doc = load_validated(path, "benchmark")
    src = str(path)
    if doc["name"] != path.stem:
        raise XmrError(f"{src}: name: {doc['name']!r} must equal the file name {path.stem!r}")
    known = list(RERANKERS.names())
    for r in doc["rerank"]:
        if r != PLAIN and r not in known:
            raise XmrError(f"{src}: rerank: unknown re-ranker {r!r}; choose from {PLAIN}, {', '.join(known)}")
    bench = Benchmark(doc["name"], path, doc["dataset"], list(doc["seeds"]), list(doc["rerank"]),
                      dict(doc["variants"]), dict(doc.get("overrides") or {}), list(doc.get("claims") or []),
                      Path(config_dir), float(doc["degenerate_std"]), doc.get("runs_from"),
                      smallest_effect={k: float(v) for k, v in doc["smallest_effect"].items()},
                      power=float(doc["power"]), query_resamples=int(doc["query_resamples"]))
    if bench.runs_from:
        bench.shared = _shared_variants(bench, load_benchmark(path.parent / f"{bench.runs_from}.yaml", config_dir))
    for v in bench.variants:
        if not bench.recipe_path(v).exists():
            raise XmrError(f"{src}: variants.{v}.recipe: no recipe {bench.recipe_path(v)}")
    for i, c in enumerate(bench.claims):
        for side in ("better", "worse"):
            variant, rerank = _side(c[side])
            if variant not in bench.variants:
                raise XmrError(f"{src}: claims[{i}].{side}: no variant {variant!r}")
            if rerank not in bench.rerank:
                raise XmrError(f"{src}: claims[{i}].{side}: re-ranker {rerank!r} is not in rerank {bench.rerank}")
        if c["metric"] not in bench.smallest_effect:
            raise XmrError(f"{src}: claims[{i}] compares {c['metric']}, which has no smallest_effect; add "
                           f"smallest_effect.{c['metric']} (docs/benchmark.md \"Verdicts\")")
        if c.get("extends") and not any(q in c["extends"] for q in ('"', "“")):
            raise XmrError(f"{src}: claims[{i}].extends must quote the sentence it extends, with its section "
                           f"(DVSE §IV-B: \"...\"), not {c['extends']!r}")
    if doc["contribution"]:
        add_contribution_claims(bench)
    kinds: dict[str, set] = {}
    for c in bench.claims:
        kinds.setdefault(c["family"], set()).add(bool(c.get("extends")))
    for family, k in kinds.items():
        if len(k) > 1:
            raise XmrError(f"{src}: family {family!r} mixes a paper's stated claims with xmr's extensions (claims "
                           f"with `extends:`); give the extensions a family of their own")
    return bench


#: the protocol: what every claim's two sides share (the batch and how it is built, the masking of in-batch positives,
#: the stopping rule: its schedule, patience and epoch cap). No method may declare these as its own; only a claim's
#: own ``differs:`` can let them differ, and its row then says so
TRAINED_ALIKE = ("train.batch_size", "train.batch_by", "train.mask_same_image", "epoch cap",
                 "train.early_stopping.enabled", "train.early_stopping.patience", "train.early_stopping.min_delta",
                 "optim.schedule.name", "optim.schedule.plateau_drops", "optim.schedule.gamma")
#: what names a run or says where its inputs lie, not how it trains (``features.dir``: the same backbone's features
#: in another folder are the same features)
META_KEYS = frozenset({"name", "paper", "method", "dataset", "description", "train.seed", "features.dir"})
#: the schedule settings each schedule reads (xmr/train/schedule.py); the others are inert under it
SCHEDULE_READS = {"none": (), "step": ("step_epochs", "gamma"), "plateau": ("gamma", "plateau_drops"),
                  "cosine": ("min_lr",)}
#: where the methods' own settings are declared (per method: key -> value and the paper's or code's place)
METHOD_SETTINGS = "method_settings.yaml"


def _get(cfg: dict, dotted: str) -> Any:
    if dotted == "epoch cap":  # train.epochs, or the rule's max_epochs when the rule is on
        from xmr.settings.run_settings import max_epochs

        return max_epochs(cfg)
    for part in dotted.split("."):
        cfg = cfg.get(part) if isinstance(cfg, dict) else None
    return cfg


def inert_keys(cfg: dict) -> set[str]:
    """Keys of a resolved run config that do not change how it trains: the schedule settings its schedule does not
    read, and ``train.epochs`` when the stopping rule's cap replaces it (``epoch cap`` compares the cap itself)."""
    sched = cfg["optim"]["schedule"]
    out = {f"optim.schedule.{k}" for k in ("step_epochs", "gamma", "plateau_drops", "min_lr")
           if k not in SCHEDULE_READS.get(sched["name"], ())}
    es = cfg["train"].get("early_stopping") or {}
    if es.get("enabled") and es.get("max_epochs") and sched["name"] != "cosine":  # cosine decays over train.epochs
        out.add("train.epochs")
    return out


@dataclass(frozen=True)
class Difference:
    """A setting on which a claim's two sides differ, and who declares it: ``variant`` (a variant of the same
    recipe sets it: what the claim ablates), a method name (that method's own setting, ``source`` its place in
    the paper or code) or ``claim`` (the claim's ``differs:``)."""
    key: str
    better: Any
    worse: Any
    by: str
    source: str = ""
    value: Any = None  # the declaring method's value (a method's own setting)

    def text(self) -> str:
        return f"`{self.key}` {_short(self.better)} / {_short(self.worse)}"


def _short(value: Any) -> str:
    import json

    return value if isinstance(value, str) else json.dumps(value)


def load_method_settings(config_dir: str | os.PathLike = "config") -> dict[str, dict[str, dict]]:
    """``config/method_settings.yaml`` (schema ``method_settings``): ``{method: {key: {value, source}}}``."""
    from xmr.config.loader import load_validated

    path = Path(config_dir) / METHOD_SETTINGS
    return load_validated(path, "method_settings") if path.exists() else {}


def claim_differences(bench: Benchmark, claim: dict, declared: dict | None = None,
                      index: int | None = None) -> list[Difference]:
    """Every setting that both sides' resolved run configs (seed aside) have with different values, each with
    who declares it; a one-line error for one that nobody declares. Keys only one side has are its method's own
    architecture; keys that do not change training (:func:`inert_keys`, :data:`META_KEYS`) are left out."""
    from xmr.run.tracking import flatten

    (bv, _), (wv, _) = _side(claim["better"]), _side(claim["worse"])
    if bv == wv:
        return []
    declared = load_method_settings(bench.config_dir) if declared is None else declared
    seed = bench.seeds[0]
    a, b = bench.run_config(bv, seed), bench.run_config(wv, seed)
    fa, fb = flatten(a), flatten(b)
    fa["epoch cap"], fb["epoch cap"] = _get(a, "epoch cap"), _get(b, "epoch cap")
    skip = META_KEYS | (inert_keys(a) & inert_keys(b))
    same_recipe = bench.variants[bv]["recipe"] == bench.variants[wv]["recipe"]
    variant_keys = set(bench.variants[bv].get("set") or {}) | set(bench.variants[wv].get("set") or {})
    own = claim.get("differs") or {}
    where = f"{bench.path}: claims[{index}] ({claim['claim']})" if index is not None else \
        f"{bench.path}: claim {claim['claim']!r}"
    out = []
    for key in sorted(set(fa) & set(fb)):
        if key in skip or fa[key] == fb[key]:
            continue
        if key in own:
            out.append(Difference(key, fa[key], fb[key], "claim", own[key]))
            continue
        if key in TRAINED_ALIKE:
            raise XmrError(f"{where}: `{bv}` and `{wv}` differ in the protocol setting {key} ({_short(fa[key])} vs "
                           f"{_short(fb[key])}); make them equal, or name it under the claim's `differs:` with why")
        if same_recipe and key in variant_keys:
            out.append(Difference(key, fa[key], fb[key], "variant", "set by the variant (what the claim ablates)"))
            continue
        for method, value in ((a["method"], fa[key]), (b["method"], fb[key])):
            entry = (declared.get(method) or {}).get(key)
            if entry is not None and entry["value"] == value:
                out.append(Difference(key, fa[key], fb[key], method, entry["source"], value))
                break
        else:
            raise XmrError(f"{where}: `{bv}` and `{wv}` differ in {key} ({_short(fa[key])} vs {_short(fb[key])}), "
                           f"declared by neither method; make it equal, or declare it as {a['method']}'s or "
                           f"{b['method']}'s own in {Path(bench.config_dir) / METHOD_SETTINGS} with its source")
    return out


def check_trained_alike(bench: Benchmark) -> dict[int, list[Difference]]:
    """Every claim between two different variants: each setting on which they differ, declared
    (:func:`claim_differences`); a one-line error naming the claim and the key for one that is not."""
    declared = load_method_settings(bench.config_dir)
    return {i: claim_differences(bench, c, declared, i) for i, c in enumerate(bench.claims)}


def _shared_variants(bench: Benchmark, source: Benchmark) -> frozenset:
    """The variants ``bench`` takes from ``source`` (its ``runs_from``): those of the same name, which must be
    trained the same way (recipe and overrides), for seeds and re-rankers ``source`` has."""
    src = f"{bench.path}: runs_from: {source.name}"
    if source.runs_from or source.dataset != bench.dataset:
        raise XmrError(f"{src}: must name a benchmark of dataset {bench.dataset} with runs of its own")
    if not set(bench.seeds) <= set(source.seeds) or not set(bench.rerank) <= set(source.rerank):
        raise XmrError(f"{src}: its seeds {source.seeds} and re-rankers {source.rerank} must include this file's "
                       f"({bench.seeds}, {bench.rerank})")
    shared = [v for v in bench.variants if v in source.variants]
    for v in shared:
        mine, theirs = bench.variants[v]["recipe"], source.variants[v]["recipe"]
        if mine != theirs or bench.overrides_of(v) != source.overrides_of(v):
            raise XmrError(f"{src}: variants.{v} has the name of {source.name}'s variant but not its recipe and "
                           f"overrides; make them equal (its runs are reused) or rename it")
    return frozenset(shared)


def _side(spec: str) -> tuple[str, str]:
    variant, _, rerank = spec.partition(":")
    return variant, rerank or PLAIN


def differs_text(diffs: list[Difference], values: bool = True) -> str:
    """The declared differences of a claim's row, grouped by who declares them (``dive's `loss.margin` 0.1 / 0.2``;
    ``values=False``: the keys alone, as the claims table shows them)."""
    owner = {"variant": "the variant's", "claim": "the claim's"}
    groups: dict[str, list[str]] = {}
    for d in diffs:
        groups.setdefault(owner.get(d.by, f"{d.by}'s"), []).append(d.text() if values else f"`{d.key}`")
    return "; ".join(f"{who} {', '.join(items)}" for who, items in groups.items())


# ------------------------------------------------------------------------------------------- contribution / recipe
CONTRIBUTION, RECIPE = "contribution", "recipe"


def contribution_variant_name(better: str, worse: str) -> str:
    """The variant that trains ``better``'s recipe with ``worse``'s values for what is not its contribution."""
    return f"{better}_as_{worse}"


def contribution_settings(bench: Benchmark, claim: dict, declared: dict, index: int) -> tuple[dict, list[str]]:
    """For a claim between two recipes: the settings the claimed-better side takes from the other side so that the
    two differ only in what its method names as its contribution (``contribution: true`` in
    config/method_settings.yaml), and the settings it cannot take (a value its method's schema refuses), kept
    and named. Empty for a claim on the same recipe (an ablation, a re-ranker)."""
    (bv, _), (wv, _) = _side(claim["better"]), _side(claim["worse"])
    if bench.variants[bv]["recipe"] == bench.variants[wv]["recipe"]:
        return {}, []
    method = bench.run_config(bv, bench.seeds[0])["method"]
    own = declared.get(method) or {}
    equal = {d.key: d.worse for d in claim_differences(bench, claim, declared, index)
             if d.by not in ("variant", "claim") and not (own.get(d.key) or {}).get("contribution", False)}
    taken, kept = {}, []
    for key, value in sorted(equal.items()):
        try:
            bench.variants["__probe__"] = {**bench.variants[bv],
                                           "set": {**(bench.variants[bv].get("set") or {}), **taken, key: value}}
            bench.run_config("__probe__", bench.seeds[0])
            taken[key] = value
        except XmrError:
            kept.append(key)
        finally:
            bench.variants.pop("__probe__", None)
    return taken, kept


def add_contribution_claims(bench: Benchmark) -> None:
    """Judge each claim between two recipes twice (docs/benchmark.md "Contribution and recipe"): as
    **contribution** (the headline, in the claim's family) against a variant of the claimed-better side trained
    with the other side's values for every declared setting its method does not name as its contribution
    (:func:`contribution_settings`; the variant ``{better}_as_{worse}`` is added to the file and trained like any
    other), and as **recipe** (as published) in a family of its own, ``{family}_recipe``. A claim with nothing to
    make equal is judged once, as it is."""
    key = _config_state(bench)
    if key in _CONTRIBUTION_CACHE:  # the workflow loads a benchmark once per job it plans: resolve it once
        variants, claims = _CONTRIBUTION_CACHE[key]
        bench.variants, bench.claims = copy.deepcopy(variants), copy.deepcopy(claims)
        return
    declared = load_method_settings(bench.config_dir)
    claims = []
    for i, c in enumerate(bench.claims):
        taken, kept = contribution_settings(bench, c, declared, i)
        if not taken:
            claims.append({**c, "judged": ""})
            continue
        (bv, br), (wv, _) = _side(c["better"]), _side(c["worse"])
        name = contribution_variant_name(bv, wv)
        base = bench.variants[bv]
        bench.variants[name] = {"recipe": base["recipe"], "set": {**(base.get("set") or {}), **taken},
                                "label": f"{bv}'s recipe with {wv}'s " + ", ".join(
                                    f"{k}={v}" for k, v in taken.items())
                                + (f" (kept: {', '.join(kept)})" if kept else "")}
        better = name if br == "none" else f"{name}:{br}"
        claims.append({**c, "better": better, "judged": CONTRIBUTION, "kept": ", ".join(kept)})
        claims.append({**c, "judged": RECIPE, "family": f"{c['family']}_{RECIPE}"})
    bench.claims = claims
    _CONTRIBUTION_CACHE[key] = (copy.deepcopy(bench.variants), copy.deepcopy(claims))


_CONTRIBUTION_CACHE: dict[tuple, tuple[dict, list]] = {}


def _config_state(bench: Benchmark) -> tuple:
    """What the contribution variants are computed from: the benchmark's path, variants, claims and seeds, and the
    name, size and modification time of every YAML file of its config folder (recipes, method files, settings)."""
    files = tuple(sorted((str(f), f.stat().st_mtime_ns, f.stat().st_size)
                         for f in Path(bench.config_dir).rglob("*.yaml")))
    return (str(Path(bench.path).resolve()), repr(bench.variants), repr(bench.claims), tuple(bench.seeds), files)


# ------------------------------------------------------------------------------------------- gathering results
def flat_metrics(result: dict) -> dict[str, dict[str, float]]:
    """``{subset: {metric: value}}`` of one evaluation (``all`` = the whole test split)."""
    def flat(d: dict) -> dict[str, float]:
        ext = d.get("extended") or {}
        return {f"{k}_r{r}": float(d[k][f"r{r}"]) for k in ("i2t", "t2i") for r in (1, 5, 10)} | \
            {"rsum": float(d["rsum"])} | \
            {f"{k}_map_at_r_ext": float((ext.get(k) or {}).get("map_at_r", float("nan"))) for k in ("i2t", "t2i")}

    out = {ALL: flat(result)}
    for name, sub in (result.get("subsets") or {}).items():
        out[name] = flat(sub)
    return out


def set_metrics(result: dict) -> dict[str, float]:
    """``SET_METRICS`` of a per-seed results file (its ``set_statistics``; NaN where it has none)."""
    stats = result.get("set_statistics") or {}
    return {m: float(stats.get(m, float("nan"))) for m in SET_METRICS}


def path_metric(evaluation: dict, subset: str, path: str) -> float:
    """A claim's metric given as a dotted path into one evaluation of a results file (``extended.t2i.map_at_r``),
    read on ``subset``: the whole split's evaluation, or its ``subsets.<subset>`` part; a path that starts with
    ``subsets.`` is read from the whole evaluation as written. NaN where the file has no such number."""
    node: Any = evaluation if subset == ALL or path.startswith("subsets.") else \
        (evaluation.get("subsets") or {}).get(subset)
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return float(node) if isinstance(node, (int, float)) else float("nan")


def gather(bench: Benchmark, results_root: str | os.PathLike = RESULTS_ROOT, strict: bool = True) -> list[dict]:
    """One record per (variant, seed, re-ranker, subset) with the metrics, from the per-seed results files (the
    run's set statistics, ``SET_METRICS``, repeated in each of its records; a claim's dotted-path metric,
    :func:`path_metric`, added where a claim names one)."""
    from xmr.core.io import read_json

    records = []
    missing = []
    for variant in bench.variants:
        for seed in bench.seeds:
            p = bench.result_path(variant, seed, results_root)
            if not p.exists():
                missing.append(str(p))
                continue
            doc = read_json(p)
            # a benchmark of one re-ranker writes a plain results file (no by_rerank)
            by_rerank = doc["by_rerank"] if "by_rerank" in doc else {doc.get("rerank") or PLAIN: doc}
            for rerank in bench.rerank:
                if rerank not in by_rerank:
                    raise XmrError(f"{p}: no evaluation with re-ranker {rerank!r}; re-run its evaluation")
                for subset, metrics in flat_metrics(by_rerank[rerank]).items():
                    paths = {m: path_metric(by_rerank[rerank], subset, m) for m in bench.path_metrics()}
                    records.append({"variant": variant, "seed": seed, "rerank": rerank, "subset": subset, **metrics,
                                    **set_metrics(doc), **paths})
    if missing and strict:
        raise XmrError(f"{len(missing)} benchmark results missing, e.g. {missing[0]}; build them with "
                       f"`snakemake -c2 results/{bench.dataset}/{bench.name}.md`")
    return records


def _values(records: list[dict], variant: str, rerank: str, subset: str, metric: str) -> dict[int, float]:
    return {r["seed"]: r[metric] for r in records
            if r["variant"] == variant and r["rerank"] == rerank and r["subset"] == subset}


__all__ = ["Benchmark", "benchmark_path", "benchmark_names", "load_benchmark", "TRAINED_ALIKE", "inert_keys",
           "Difference", "load_method_settings", "claim_differences", "check_trained_alike", "differs_text",
           "add_contribution_claims", "flat_metrics", "set_metrics", "path_metric", "gather"]
