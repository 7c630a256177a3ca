"""Helpers the Snakemake rules call (kept in the package so the Snakefile holds no logic)."""

from __future__ import annotations

from pathlib import Path

from xmr.errors import XmrError

RERANKERS = ("fr", "rr", "mr", "isoftmax", "dsl", "qbnorm", "csls")

#: printed by the workflow's ``onerror`` handler (workflow/rules/common.smk)
AFTER_FAILURE = ("xmr: the workflow stopped; the failed job's one-line error is in its log above. If Snakemake "
                 "itself was killed (pre-emption, kill -9, lost node), run `snakemake --unlock` once, then the same "
                 "command with --rerun-incomplete: unfinished outputs are redone, training resumes from last.pt and "
                 "extraction from its finished shards (docs/faults.md).")


def validate_workflow_config(config: dict, schema_path: str | Path) -> dict:
    """Validate (and fill defaults of) the workflow config against its schema with xmr's one config validator:
    a bad key is one line naming it and its nearest valid names, not Snakemake's dump of the whole schema."""
    import sys

    from xmr.config import load_yaml, validate

    try:
        return validate(config, load_yaml(schema_path), "config/config.yaml (with --config overrides)")
    except XmrError as e:  # Snakemake would add a traceback to the one line
        print(f"xmr workflow: error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def parse_target(dataset: str, target: str, config_dir: str | Path = "config") -> tuple[str, str | None]:
    """``results/{dataset}/{target}.json`` -> (recipe, reranker): ``dvse_fr`` is recipe ``dvse`` + FR unless a
    recipe file is literally called ``dvse_fr``."""
    recipes = Path(config_dir) / "recipes" / dataset
    if (recipes / f"{target}.yaml").exists():
        return target, None
    base, _, suffix = target.rpartition("_")
    if suffix in RERANKERS and (recipes / f"{base}.yaml").exists():
        return base, suffix
    known = sorted(p.stem for p in recipes.glob("*.yaml"))
    raise XmrError(f"no recipe for results/{dataset}/{target}.json: expected {recipes / (target + '.yaml')} "
                   f"(recipes for {dataset}: {', '.join(known) or 'none'}; re-ranker suffixes: {', '.join(RERANKERS)})")


def recipe_path(dataset: str, recipe: str, config_dir: str | Path = "config") -> str:
    return str(Path(config_dir) / "recipes" / dataset / f"{recipe}.yaml")


def recipe_features(dataset: str, recipe: str, config_dir: str | Path = "config") -> dict:
    """What a recipe's training needs: backbone key, feature dir, image source and the dataset's splits."""
    from xmr.config import load_run_config

    cfg = load_run_config(recipe_path(dataset, recipe, config_dir))
    ds = cfg["dataset_cfg"]
    return {"backbone": cfg["features"]["backbone"], "dir": cfg["features"]["dir"],
            "source": cfg["features"]["source"], "splits": ["train", ds["val_split"], ds["test_split"]],
            "annotations": ds.get("annotations")}


def image_inputs(dataset: str, info: dict, splits: list[str]) -> list[str]:
    """The files the image side of ``splits`` is read from, for a :func:`recipe_features` ``info``: the feature
    files ``{dir}/{dataset}/{backbone}/{split}.h5``, or, end to end (``features.source: images``), the dataset's
    annotation file(s) (the image files are checked when training starts, as ``xmr extract`` does)."""
    if info.get("source") == "images":
        ann = info.get("annotations") or []
        return [ann] if isinstance(ann, str) else list(ann)
    return [f"{info['dir']}/{dataset}/{info['backbone']}/{s}.h5" for s in splits]


def recipe_image_inputs(dataset: str, recipe: str, splits: list[str] | str,
                        config_dir: str | Path = "config") -> list[str]:
    """:func:`image_inputs` of a recipe; ``splits``: split names, or ``train`` (train + val: training reads both)
    or ``score`` (the test split)."""
    info = recipe_features(dataset, recipe, config_dir)
    named = {"train": info["splits"][:2], "score": info["splits"][2:]}
    return image_inputs(dataset, info, named.get(splits, [splits]) if isinstance(splits, str) else splits)


def rerank_inputs(run_dir: str, reranker: str | None) -> dict[str, str]:
    """Files a re-ranker reads besides the similarity matrix, as ``{parameter: path}``: QB-Norm's query bank
    (rule ``score_bank``); none for the others."""
    if reranker == "qbnorm":
        return {k: f"{run_dir}/qbnorm_{k}.npy" for k in ("bank_i2t", "bank_t2i")}
    return {}


def rerank_options(run_dir: str, reranker: str | None) -> str:
    """The ``xmr test`` options selecting ``reranker`` (empty for plain evaluation)."""
    if not reranker:
        return ""
    files = rerank_inputs(run_dir, reranker)
    extra = " --rerank-param " + " ".join(f"{k}={v}" for k, v in files.items()) if files else ""
    return f"--rerank {reranker}{extra}"
