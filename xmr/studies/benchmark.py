"""The seeded benchmark: ``config/benchmark/{name}.yaml`` (schema ``xmr/schemas/benchmark.schema.yaml``).

Every variant (a recipe plus overrides) is trained once per seed into ``runs/{dataset}/bench/{name}/{variant}/s{seed}/``
and evaluated once, plain and with every re-ranker of the file, into
``results/{dataset}/bench/{name}/{variant}/s{seed}.json`` (:func:`xmr.run.results.evaluate_run_many`). Then
:func:`write_benchmark` gathers them into ``results/{dataset}/{name}.{md,csv,json,png}`` (mean ± std over seeds, on
the whole test split and on each evaluation subset of the dataset, e.g. synth's ``ambiguous`` queries; how each run's
training ended and the spread of its test matrix, collapsed runs flagged), ``{name}_curves.png`` (validation curves)
and ``results/{dataset}/{name}_claims.{md,csv}``: each claim of a seed paper with our difference and a verdict.

Verdicts (docs/benchmark.md "Verdicts"; :mod:`xmr.studies.claims`): one-sided t tests in the claimed direction
(paired over seeds when both sides are the same trained models, with a query-level paired bootstrap beside it; else
Welch's), a one-sided non-superiority test against the file's ``smallest_effect``, an exact permutation test over
seeds beside each, Holm's step-down rule within each family across every benchmark file; each verdict is scoped to
the dataset (*holds on synth*, *reversed on synth*, *no effect ≥ Δ on synth*, *underpowered on synth*). Both sides
must differ only in declared settings (:func:`claim_differences`).
"""

from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from xmr.core.errors import XmrError
from xmr.evaluation.stats import compare, holm, mean_std, t_test  # noqa: F401 - the statistics of the claims
from xmr.studies.claims import (ALPHA, HOLDS, NO_EFFECT, REVERSED, UNDERPOWERED, claims_markdown,  # noqa: F401
                                judge_claims, verdict)
from xmr.run.layout import RESULTS_ROOT, RUNS_ROOT, RunKey, results_dir

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
        from xmr.studies.claims import add_contribution_claims

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
#: what names a run, not how it trains
META_KEYS = frozenset({"name", "paper", "method", "dataset", "description", "train.seed"})
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


def median_epoch_seconds(run_dir: str | os.PathLike) -> float | None:
    """The median of a run's epoch times (``history.csv``'s ``seconds``): what an epoch takes, unmoved by an epoch
    that stalled (a paused or resumed run, other work on the machine), which ``train_seconds`` counts in full."""
    path = Path(run_dir) / "history.csv"
    if not path.exists():
        return None
    from xmr.core.io import read_history

    secs = [r["seconds"] for r in read_history(run_dir) if "seconds" in r]
    return float(np.median(secs)) if secs else None


IN_BATCH = (32, 128)  # batch sizes of the in-batch top-1 column: the synth recipes' two batch sizes


def gather_training(bench: Benchmark, results_root: str | os.PathLike = RESULTS_ROOT,
                    runs_root: str | os.PathLike = RUNS_ROOT) -> list[dict]:
    """One record per (variant, seed) present: how its training ended and the spread of its test matrix (what
    each per-seed results file repeats from the run; NaN / None for results written before they were recorded),
    and the in-batch top-1 of its scored test matrix (``runs/.../test_sims.npy``) at each batch of ``IN_BATCH``."""
    from xmr.core.io import read_json
    from xmr.evaluation.spread import in_batch_top1

    out = []
    for variant in bench.variants:
        for seed in bench.seeds:
            p = bench.result_path(variant, seed, results_root)
            if not p.exists():
                continue
            doc = read_json(p)
            spread = doc.get("similarity_spread") or {}
            sims_file = bench.run_dir(variant, seed, runs_root) / "test_sims.npy"
            sims = np.load(sims_file) if sims_file.exists() else None
            # a per-seed file holds one evaluation per re-ranker (by_rerank); the split's facts are in each
            per_caption = (doc.get("by_rerank") or {}).get(PLAIN, doc).get("captions_per_image")
            top1 = {f"in_batch_top1_b{b}": (in_batch_top1(np.asarray(sims), int(per_caption), b)
                                            if sims is not None and per_caption and sims.shape[0] >= b
                                            else float("nan"))
                    for b in IN_BATCH}
            usage = (doc.get("set_statistics") or {}).get("slot_usage") or {}
            out.append({"variant": variant, "seed": seed, "epochs_trained": doc.get("epochs_trained"),
                        "best_epoch": doc.get("best_epoch"), "stopped_by": doc.get("stopped_by"),
                        "train_seconds": doc.get("train_seconds"),
                        "epoch_seconds": median_epoch_seconds(bench.run_dir(variant, seed, runs_root)),
                        "sim_std": float(spread.get("std", float("nan"))),
                        "sim_margin": float(spread.get("margin", float("nan"))),
                        "collapsed": bool(spread) and float(spread["std"]) < bench.degenerate_std, **top1,
                        **set_metrics(doc), "slot_entropy": float(usage.get("entropy_normalised", float("nan")))})
    return out


def training_markdown(bench: Benchmark, training: list[dict]) -> str:
    """Per variant: epochs trained, how training ended, seconds per epoch, the test matrix's spread, with
    collapsed runs (std below ``degenerate_std``) flagged, and for set methods how far apart the sub-embeddings are
    (mean off-diagonal cosine of an image's sub-embeddings; slot usage's normalised entropy)."""
    out = io.StringIO()
    out.write(f"**Training and similarity spread** (per variant over its seeds; test similarities: std and the mean "
              f"margin between each query's best positive and its hardest negative; ⚠ = a run with std < "
              f"{bench.degenerate_std:g}, i.e. collapsed; set methods: *set corr.* = mean off-diagonal cosine of an "
              f"image's final sub-embeddings over the test images (DVSE Fig. 6's measure; 1 = one vector), *slot "
              f"entropy* = entropy of which sub-embedding scores each positive pair highest, over log2 K (1 = all "
              f"used alike, 0 = one))\n\n")
    top1_heads = " | ".join(f"top-1 B {b}" for b in IN_BATCH)
    out.write(f"| variant | batch | epochs trained | best epoch | ended by | s / epoch | min / run | test sim. std | "
              f"margin | {top1_heads} | set corr. | slot entropy | collapsed |\n|---|---|---|---|---|---|---|---|---|"
              + "---|" * len(IN_BATCH) + "---|---|---|\n")
    for v in bench.variants:
        recs = [r for r in training if r["variant"] == v]
        if not recs:
            continue

        def span(key: str) -> str:
            vals = [r[key] for r in recs if r[key] is not None]
            if not vals:
                return "–"
            return f"{min(vals)}" if min(vals) == max(vals) else f"{min(vals)}–{max(vals)}"

        ends = [r["stopped_by"] for r in recs if r["stopped_by"]]
        ended = ", ".join(f"{e} ×{ends.count(e)}" for e in dict.fromkeys(ends)) or "–"
        # each run's median epoch (its measured mean when no history is kept), times its epochs
        timed = [r for r in recs if r["train_seconds"] and r["epochs_trained"]]
        per_epoch = [r.get("epoch_seconds") or r["train_seconds"] / r["epochs_trained"] for r in timed]
        sec = f"{np.mean(per_epoch):.0f}" if per_epoch else "–"
        minutes = [p * r["epochs_trained"] / 60 for p, r in zip(per_epoch, timed)]
        per_run = f"{np.mean(minutes):.1f}" if minutes else "–"
        std_m, std_s = mean_std(r["sim_std"] for r in recs)
        mar_m, mar_s = mean_std(r["sim_margin"] for r in recs)
        n_col = sum(r["collapsed"] for r in recs)
        top1 = " | ".join(_pm(*mean_std(r.get(f"in_batch_top1_b{b}", float("nan")) for r in recs), 2)
                          for b in IN_BATCH)
        corr = _pm(*mean_std(r.get("correlation", float("nan")) for r in recs), 3)
        entropy = _pm(*mean_std(r.get("slot_entropy", float("nan")) for r in recs), 2)
        batch = bench.run_config(v, bench.seeds[0])["train"]["batch_size"]
        out.write(f"| {v} | {batch} | {span('epochs_trained')} | {span('best_epoch')} | {ended} | {sec} | {per_run} | "
                  f"{_pm(std_m, std_s, 4)} | {_pm(mar_m, mar_s, 4)} | {top1} | {corr} | {entropy} | "
                  f"{f'⚠ {n_col} of {len(recs)}' if n_col else 'no'} |\n")
    out.write("\n")
    return out.getvalue()


def run_histories(bench: Benchmark, runs_root: str | os.PathLike = RUNS_ROOT) -> dict[str, list[list[dict]]]:
    """``{variant: [history rows of each seed's run]}`` for the runs that have a history.csv."""
    from xmr.core.io import read_history

    out: dict[str, list[list[dict]]] = {}
    for v in bench.variants:
        runs = [read_history(bench.run_dir(v, s, runs_root)) for s in bench.seeds
                if (bench.run_dir(v, s, runs_root) / "history.csv").exists()]
        if runs:
            out[v] = runs
    return out


def _values(records: list[dict], variant: str, rerank: str, subset: str, metric: str) -> dict[int, float]:
    return {r["seed"]: r[metric] for r in records
            if r["variant"] == variant and r["rerank"] == rerank and r["subset"] == subset}


def differs_text(diffs: list[Difference], values: bool = True) -> str:
    """The declared differences of a claim's row, grouped by who declares them (``dive's `loss.margin` 0.1 / 0.2``;
    ``values=False``: the keys alone, as the claims table shows them)."""
    owner = {"variant": "the variant's", "claim": "the claim's"}
    groups: dict[str, list[str]] = {}
    for d in diffs:
        groups.setdefault(owner.get(d.by, f"{d.by}'s"), []).append(d.text() if values else f"`{d.key}`")
    return "; ".join(f"{who} {', '.join(items)}" for who, items in groups.items())


def ranks_path(result_path: str | os.PathLike) -> Path:
    """The per-query ranks written beside a results file (``s0.json`` -> ``s0.ranks.npz``)."""
    return Path(result_path).with_suffix(".ranks.npz")


#: per metric, the recall cut-offs each direction adds up (RSUM: all six)
QUERY_CUTOFFS = {"rsum": ((1, 5, 10), (1, 5, 10)), "i2t_r1": ((1,), ()), "t2i_r1": ((), (1,))}


def query_differences(ranks: dict[str, np.ndarray], better: str, worse: str, subset: str = ALL,
                      metric: str = "rsum") -> np.ndarray:
    """Per image cluster (an image with its captions), its contribution to ``metric``(better) - ``metric``(worse)
    of one trained model under two re-rankers, from the per-query ranks (:func:`xmr.run.results.write_query_ranks`);
    the contributions add up to the metric's difference. Clusters with no query in ``subset`` are left out."""
    i2t_k, t2i_k = QUERY_CUTOFFS[metric]
    c = int(ranks["captions_per_image"])
    bi, wi, bt, wt = (ranks[f"{r}/{d}"] for d in ("i2t", "t2i") for r in (better, worse))
    n, m = bi.size, bt.size
    im = ranks[f"subset/{subset}/images"] if subset != ALL else np.ones(n, bool)
    cm = ranks[f"subset/{subset}/captions"] if subset != ALL else np.ones(m, bool)

    def hits(r: np.ndarray, ks: tuple[int, ...]) -> np.ndarray:
        return sum((r < k).astype(np.float64) for k in ks) if ks else np.zeros(r.size)

    per_image = np.where(im, 100.0 * (hits(bi, i2t_k) - hits(wi, i2t_k)) / max(int(im.sum()), 1), 0.0)
    per_caption = np.where(cm, 100.0 * (hits(bt, t2i_k) - hits(wt, t2i_k)) / max(int(cm.sum()), 1), 0.0)
    owner = np.arange(m) // c
    d = per_image + np.bincount(owner, weights=per_caption, minlength=n)
    keep = im | (np.bincount(owner, weights=cm.astype(np.float64), minlength=n) > 0)
    return d[keep]


def query_level(bench: Benchmark, claim: dict, seeds: list[int],
                results_root: str | os.PathLike = RESULTS_ROOT) -> dict[str, float]:
    """The query-level paired test of a claim on the same trained models (a re-ranker against plain): the
    per-cluster differences of each seed's test queries, resampled by image cluster within each seed
    (:func:`xmr.evaluation.stats.cluster_bootstrap`). It answers: on this test set, do these trained models
    gain? (The seed-level test asks it of training runs in general.)"""
    from xmr.evaluation.stats import cluster_bootstrap
    from xmr.run.results import read_query_ranks

    (v, br), (_, wr) = _side(claim["better"]), _side(claim["worse"])
    per_seed = [query_differences(read_query_ranks(ranks_path(bench.result_path(v, s, results_root))), br, wr,
                                  claim["subset"], claim["metric"]) for s in seeds]
    return cluster_bootstrap(per_seed, bench.query_resamples, seed=0)


# ------------------------------------------------------------------------------------------------- writing
def _pm(m: float, s: float, digits: int = 1) -> str:
    if not math.isfinite(m):
        return "–"
    return f"{m:.{digits}f} ± {s:.{digits}f}" if math.isfinite(s) else f"{m:.{digits}f}"


def summary_rows(bench: Benchmark, records: list[dict]) -> list[dict]:
    """Mean and std over seeds of every metric, per (variant, re-ranker, subset)."""
    rows = []
    subsets = list(dict.fromkeys(r["subset"] for r in records))
    for variant in bench.variants:
        for rerank in bench.rerank:
            for subset in subsets:
                row = {"variant": variant, "label": bench.label(variant), "rerank": rerank, "subset": subset}
                for m in METRICS:
                    vals = _values(records, variant, rerank, subset, m)
                    if not vals:
                        break
                    row[f"{m}_mean"], row[f"{m}_std"] = mean_std(vals.values())
                    row["seeds"] = len(vals)
                else:
                    for m in EXTENDED_METRICS:  # beside RSUM; NaN where the results files have none
                        row[f"{m}_mean"], row[f"{m}_std"] = mean_std(
                            v for v in _values(records, variant, rerank, subset, m).values() if math.isfinite(v))
                    rows.append(row)
    return rows


def timing(bench: Benchmark, runs_root: str | os.PathLike = RUNS_ROOT,
           results_root: str | os.PathLike = RESULTS_ROOT) -> dict[str, float]:
    """Training minutes summed over runs (their train.json) and the wall span from the first run's start (its
    config.yaml) to the last results file."""
    from xmr.core.io import read_json

    train_s, median_s, starts, ends = 0.0, 0.0, [], []
    for v in bench.variants:
        if v in bench.shared:  # the runs of runs_from, timed there
            continue
        for s in bench.seeds:
            run = bench.run_dir(v, s, runs_root)
            if (run / "train.json").exists():
                summary = read_json(run / "train.json")
                train_s += float(summary.get("train_seconds") or 0.0)
                epoch_s = median_epoch_seconds(run)
                median_s += (epoch_s * int(summary.get("epochs_trained") or 0) if epoch_s is not None
                             else float(summary.get("train_seconds") or 0.0))
            if (run / "config.yaml").exists():
                starts.append((run / "config.yaml").stat().st_mtime)
            res = bench.result_path(v, s, results_root)
            if res.exists():
                ends.append(res.stat().st_mtime)
    wall = (max(ends) - min(starts)) if starts and ends else float("nan")
    return {"train_minutes_sum": train_s / 60, "median_minutes_sum": median_s / 60, "wall_minutes": wall / 60,
            "runs": len(starts)}


def split_description(dataset: str, config_dir: str | os.PathLike = "config") -> str:
    """Which split a table's numbers are from: the dataset's test split and, for a generated dataset, the seed its
    test images came from (``the synth test split, test images from seed 20261207``)."""
    from xmr.config.loader import load_dataset_config

    if not (Path(config_dir) / "datasets" / f"{dataset}.yaml").exists():
        return f"the {dataset} test split"
    ds = load_dataset_config(dataset, config_dir)
    gen = ds.get("generate") or {}
    seed = gen.get("test_seed", gen.get("seed")) if gen else None
    where = "" if seed is None else f", test images from seed {seed}" + \
        ("" if "test_seed" in gen else " (drawn after the training and validation images)")
    return f"the {dataset} {ds.get('test_split', 'test')} split{where}"


def dataset_stats(bench: Benchmark) -> dict | None:
    """``xmr synth --stats`` of the benchmark's dataset when it is generated (synth), else None."""
    from xmr.config.loader import load_dataset_config

    if not (bench.config_dir / "datasets" / f"{bench.dataset}.yaml").exists():
        return None
    ds = load_dataset_config(bench.dataset, bench.config_dir)
    if "generate" not in ds or not Path(ds["annotations"]).exists():
        return None
    from xmr.data.synth import synth_stats

    return synth_stats(ds["annotations"], batches=100)


def benchmark_markdown(bench: Benchmark, rows: list[dict], claims: list[dict], times: dict,
                       stats: dict | None = None, missing: list[str] = (), training: list[dict] = ()) -> str:
    out = io.StringIO()
    out.write(f"Measured on {split_description(bench.dataset, bench.config_dir)}.\n\n")
    if stats:
        test = stats["splits"].get("test", {})
        out.write(f"Dataset ({stats['file']}, style {stats['style']}): false_negative_rate_b128 "
                  f"{stats['false_negative_rate_b128']:.3f} (`xmr synth --stats`); test split {test.get('images')} "
                  f"images / {test.get('captions')} captions, subset `ambiguous` {test.get('ambiguous_images')} "
                  f"images / {test.get('ambiguous_captions')} captions.\n\n")
    n = len(bench.seeds)
    subsets = list(dict.fromkeys(r["subset"] for r in rows))
    heads = ["i2t R@1", "i2t R@5", "i2t R@10", "t2i R@1", "t2i R@5", "t2i R@10", "RSUM", "i2t mAP@R (ext.)",
             "t2i mAP@R (ext.)"]
    for subset in subsets:
        title = "whole test split" if subset == ALL else f"subset `{subset}`"
        out.write(f"**{bench.dataset} test, {title}, no re-ranking** (mean ± std over {n} seeds)\n\n")
        out.write("| variant | " + " | ".join(heads) + " |\n|---|" + "---|" * len(heads) + "\n")
        for r in rows:
            if r["subset"] == subset and r["rerank"] == PLAIN:
                out.write(f"| {r['variant']} | " + " | ".join(
                    _pm(r.get(f"{m}_mean", math.nan), r.get(f"{m}_std", math.nan)) for m in METRICS + EXTENDED_METRICS)
                    + " |\n")
        out.write("\n")
    others = [x for x in bench.rerank if x != PLAIN]
    if others:
        for subset in subsets:
            title = "whole test split" if subset == ALL else f"subset `{subset}`"
            out.write(f"**RSUM with each re-ranker, {title}** (mean ± std over {n} seeds)\n\n")
            out.write("| variant | none | " + " | ".join(others) + " |\n|---|" + "---|" * (len(others) + 1) + "\n")
            for v in bench.variants:
                cells = []
                for rr in [PLAIN] + others:
                    hit = [r for r in rows if r["variant"] == v and r["rerank"] == rr and r["subset"] == subset]
                    cells.append(_pm(hit[0]["rsum_mean"], hit[0]["rsum_std"]) if hit else "–")
                out.write(f"| {v} | " + " | ".join(cells) + " |\n")
            out.write("\n")
    if training:
        out.write(training_markdown(bench, list(training)))
    out.write("Variants: " + "; ".join(f"`{v}` = {bench.label(v)}" for v in bench.variants) + ".\n\n")
    if missing:
        out.write(f"**Incomplete: {len(missing)} of {len(bench.variants) * n} runs have no results yet** "
                  f"({', '.join(missing)}); their claims are marked *not run* and means use the seeds present.\n\n")
    out.write(time_line(bench, times))
    return out.getvalue()


def time_line(bench: Benchmark, times: dict) -> str:
    shared = (f"; the runs of {', '.join(f'`{v}`' for v in sorted(bench.shared))} are {bench.runs_from}'s, not "
              f"counted here" if bench.shared else "")
    own = len(bench.variants) - len(bench.shared)
    median = times.get("median_minutes_sum", times["train_minutes_sum"])
    return (f"{times['runs']} trainings ({own} variants × {len(bench.seeds)} seeds{shared}); "
            f"{times['train_minutes_sum']:.1f} min of training measured in all, {median:.1f} at each run's median "
            f"epoch time (*s / epoch*, *min / run*: a run paused, resumed or sharing the machine with other work "
            f"counts its stalls in the first figure only); wall time from the first training to the last evaluation "
            f"{times['wall_minutes']:.1f} min.\n")


def training_part(bench: Benchmark, training: list[dict], times: dict, missing: list[str] = ()) -> str:
    """The short page part: how each variant trained (epochs, ending, time, spread) and what the whole run took."""
    note = (f"**Incomplete: {len(missing)} runs have no results yet** ({', '.join(missing)}).\n\n"
            if missing else "")
    return (f"Measured on {split_description(bench.dataset, bench.config_dir)}.\n\n" + training_markdown(bench, training)
            + note + time_line(bench, times))


def _seeds_note(n: int, n_seeds: int) -> str:
    return "" if n >= n_seeds else f" ({n} seeds)"


def plot_benchmark(bench: Benchmark, rows: list[dict], out_png: str | os.PathLike) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    subsets = list(dict.fromkeys(r["subset"] for r in rows))
    fig, axes = plt.subplots(1, len(subsets), figsize=(6 * len(subsets), 4.2), squeeze=False)
    names = list(bench.variants)
    shown = [x for x in (PLAIN, "fr") if x in bench.rerank]
    width = 0.8 / len(shown)
    for ax, subset in zip(axes[0], subsets):
        for k, rr in enumerate(shown):
            means, stds = [], []
            for v in names:
                hit = [r for r in rows if r["variant"] == v and r["rerank"] == rr and r["subset"] == subset]
                means.append(hit[0]["rsum_mean"] if hit else np.nan)
                stds.append(hit[0]["rsum_std"] if hit else 0.0)
            x = np.arange(len(names)) + (k - (len(shown) - 1) / 2) * width
            ax.bar(x, means, width, yerr=np.nan_to_num(stds), capsize=3, label="plain" if rr == PLAIN else rr)
        ax.set_xticks(np.arange(len(names)))
        ax.set_xticklabels(names, rotation=60, ha="right", fontsize=8)
        ax.set_ylabel("RSUM (mean ± std over seeds)")
        ax.set_title(f"{bench.dataset}: {'whole test split' if subset == ALL else subset}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)


def validation_curves_label(histories: dict[str, list[list[dict[str, float]]]]) -> str:
    """The y-axis of :func:`plot_validation_curves`: a mean ± std only where some line stands for several runs."""
    runs = max((len(v) for v in histories.values()), default=0)
    return "validation RSUM (mean ± std over seeds)" if runs > 1 else "validation RSUM (one run per line)"


def plot_validation_curves(histories: dict[str, list[list[dict[str, float]]]], out_png: str | os.PathLike,
                           title: str) -> None:
    """Validation RSUM per epoch of each variant's seeds: the mean over the runs that reached an epoch, with a
    ± std band where two or more did; a run that stopped earlier ends its contribution there. The legend gives
    each line's number of runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    for name, runs in histories.items():
        by_epoch: dict[float, list[float]] = {}
        for rows in runs:
            for r in rows:
                if "val_rsum" in r:
                    by_epoch.setdefault(r["epoch"], []).append(r["val_rsum"])
        if not by_epoch:
            continue
        epochs = sorted(by_epoch)
        mean = np.array([np.mean(by_epoch[e]) for e in epochs])
        std = np.array([np.std(by_epoch[e], ddof=1) if len(by_epoch[e]) > 1 else 0.0 for e in epochs])
        line, = ax.plot(epochs, mean, marker=".", markersize=3, label=f"{name} ({len(runs)})")
        ax.fill_between(epochs, mean - std, mean + std, color=line.get_color(), alpha=0.15, linewidth=0)
    ax.set_xlabel("epoch")
    ax.set_ylabel(validation_curves_label(histories))
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, ncol=2)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out_png, dpi=100, format="png")
    plt.close(fig)


def write_benchmark(bench: Benchmark, out_dir: str | os.PathLike | None = None,
                    results_root: str | os.PathLike = RESULTS_ROOT, runs_root: str | os.PathLike = RUNS_ROOT,
                    strict: bool = True) -> dict[str, Path]:
    """Write ``{name}.md/.csv/.json/.png``, ``{name}_curves.png``, ``{name}_claims.md/.csv`` and ``{name}_training.md``
    (atomically) and return their paths. ``strict=False`` writes what exists: missing runs are listed and their claims marked *not run*."""
    from xmr.core.io import atomic_path, write_json

    differences = check_trained_alike(bench)
    out = Path(out_dir or results_dir(bench.dataset, results_root))
    out.mkdir(parents=True, exist_ok=True)
    records = gather(bench, results_root, strict)
    rows = summary_rows(bench, records)
    claims = judge_claims(bench, records, differences, results_root)
    times = timing(bench, runs_root, results_root)
    stats = dataset_stats(bench)
    training = gather_training(bench, results_root, runs_root)
    paths = {k: out / f"{bench.name}{suffix}" for k, suffix in
             (("md", ".md"), ("csv", ".csv"), ("json", ".json"), ("png", ".png"), ("claims_md", "_claims.md"),
              ("claims_csv", "_claims.csv"), ("curves_png", "_curves.png"), ("training_md", "_training.md"))}
    present = {(r["variant"], r["seed"]) for r in records}
    missing = [f"{v}/s{sd}" for v in bench.variants for sd in bench.seeds if (v, sd) not in present]
    for key, text in (("md", benchmark_markdown(bench, rows, claims, times, stats, missing, training)),
                      ("claims_md", claims_markdown(claims, len(bench.seeds), bench, differences,
                                                    split_description(bench.dataset, bench.config_dir))),
                      ("training_md", training_part(bench, training, times, missing)),
                      ("csv", _csv(records)), ("claims_csv", _csv(claims))):
        with atomic_path(paths[key], ".tmp") as tmp:
            tmp.write_text(text)
    write_json(paths["json"], {"benchmark": bench.name, "dataset": bench.dataset, "seeds": bench.seeds,
                               "summary": rows, "claims": claims, "timing": times, "dataset_stats": stats,
                               "training": training, "degenerate_std": bench.degenerate_std})
    with atomic_path(paths["png"], ".png") as tmp:
        plot_benchmark(bench, rows, tmp)
    with atomic_path(paths["curves_png"], ".png") as tmp:
        plot_validation_curves(run_histories(bench, runs_root), tmp,
                               f"{bench.dataset}: validation RSUM per epoch (mean ± std over seeds)")
    return paths


def _csv(rows: list[dict]) -> str:
    out = io.StringIO()
    if rows:
        w = csv.DictWriter(out, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return out.getvalue()


__all__ = ["Benchmark", "benchmark_names", "load_benchmark", "benchmark_path", "gather", "summary_rows", "judge_claims", "compare",
           "t_test", "holm", "verdict", "gather_training", "run_histories", "mean_std", "write_benchmark", "flat_metrics",
           "validation_curves_label"]
