# Experiments: sweeps and ablations as data (config/experiments/{experiment}.yaml; docs/report.md).
# Each variant of a recipe is trained into runs/{dataset}/exp/{experiment}/{variant}/, scored, and evaluated into
# results/{dataset}/exp/{experiment}/{variant}[_{reranker}].json; `experiment_table` gathers them into
# table.md/table.csv/figure.png. An experiment of existing recipes (`recipes:`) reuses results/{dataset}/*.json.
#
#   snakemake -c2 results/synth/exp/dvse_k_sweep/table.md     # one experiment
#   snakemake -c2 experiments                                  # every experiment of the default dataset

from xmr.experiments import list_experiments, load_experiment, resolve_variant
from xmr.layout import announce_trainings, planned_runs


wildcard_constraints:
    experiment="[a-z0-9_]+",
    variant="[a-z0-9_]+",


def experiment_file(wc):
    return f"config/experiments/{wc.experiment}.yaml"


def experiment_of(wc):
    exp = load_experiment(experiment_file(wc))
    exp.check_dataset(wc.dataset)
    return exp


def variant_of(wc):
    """The variant a rule's wildcards name (rules with {target} parse it: {variant}[_{reranker}])."""
    exp = experiment_of(wc)
    variant = wc.get("variant") or exp.parse_target(wc.target)[0]
    exp.check_variant(variant)
    if exp.kind != "variants":
        raise ValueError(f"experiment {exp.name} compares existing recipes: its results are results/{wc.dataset}/"
                         f"{{recipe}}[_{{reranker}}].json, not runs under runs/{wc.dataset}/exp/")
    return exp, variant


def variant_features(wc, splits):
    exp, variant = variant_of(wc)
    cfg = resolve_variant(exp, variant, wc.dataset)
    ds = cfg["dataset_cfg"]
    names = {"train": "train", "val": ds["val_split"], "test": ds["test_split"]}
    return [f"{cfg['features']['dir']}/{wc.dataset}/{cfg['features']['backbone']}/{names[s]}.h5" for s in splits]


def variant_run(wc):
    return f"runs/{wc.dataset}/exp/{wc.experiment}/{variant_of(wc)[1]}"


rule train_variant:
    input:
        experiment=experiment_file,
        recipe=lambda wc: recipe_path(wc.dataset, variant_of(wc)[0].recipe),
        features=lambda wc: variant_features(wc, ["train", "val"]),
    output:
        ckpt="runs/{dataset}/exp/{experiment}/{variant}/best.pt",
        summary="runs/{dataset}/exp/{experiment}/{variant}/train.json",
    log:
        "logs/train/{dataset}_exp_{experiment}_{variant}.log",
    threads: res("train", "cpus_per_task")
    resources:
        gpu=res("train", "gpu"),
        mem_mb=res("train", "mem_mb"),
        runtime=res("train", "runtime"),
        cpus_per_task=res("train", "cpus_per_task"),
    shell:
        "{XMR} train --experiment {input.experiment} --variant {wildcards.variant} --dataset {wildcards.dataset}"
        " --out-dir runs/{wildcards.dataset}/exp/{wildcards.experiment}/{wildcards.variant} --no-progress"
        " > {log} 2>&1"


rule score_variant:
    input:
        ckpt="runs/{dataset}/exp/{experiment}/{variant}/best.pt",
        features=lambda wc: variant_features(wc, ["test"]),
    output:
        "runs/{dataset}/exp/{experiment}/{variant}/test_sims.npy",
    log:
        "logs/score/{dataset}_exp_{experiment}_{variant}.log",
    resources:
        gpu=res("score", "gpu"),
        mem_mb=res("score", "mem_mb"),
        runtime=res("score", "runtime"),
        cpus_per_task=res("score", "cpus_per_task"),
    shell:
        "{XMR} score --run runs/{wildcards.dataset}/exp/{wildcards.experiment}/{wildcards.variant} --out {output}"
        " --no-progress > {log} 2>&1"


def variant_rerank(wc):
    reranker = experiment_of(wc).parse_target(wc.target)[1]
    return f"--rerank {reranker}" if reranker else ""


rule evaluate_variant:
    input:
        sims=lambda wc: f"{variant_run(wc)}/test_sims.npy",
    output:
        "results/{dataset}/exp/{experiment}/{target}.json",
    params:
        run=variant_run,
        rerank=variant_rerank,
    log:
        "logs/evaluate/{dataset}_exp_{experiment}_{target}.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("light", "runtime"),
        cpus_per_task=res("light", "cpus_per_task"),
    shell:
        "{XMR} test --run {params.run} --sims {input.sims} {params.rerank} --out {output} > {log} 2>&1"


def experiment_results(wc):
    exp = experiment_of(wc)
    announce_trainings(f"results/{wc.dataset}/exp/{wc.experiment}/table.md", planned_runs(wc.dataset, [], [exp]))
    return [str(p) for _, _, p in exp.targets(wc.dataset)]


rule experiment_table:
    input:
        experiment=experiment_file,
        results=experiment_results,
    output:
        md="results/{dataset}/exp/{experiment}/table.md",
        csv="results/{dataset}/exp/{experiment}/table.csv",
        png="results/{dataset}/exp/{experiment}/figure.png",
    log:
        "logs/experiments/{dataset}_{experiment}.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("light", "runtime"),
        cpus_per_task=res("light", "cpus_per_task"),
    shell:
        "{XMR} experiment-table --experiment {input.experiment} --dataset {wildcards.dataset} --strict > {log} 2>&1"


rule experiments:
    # every experiment of the default dataset (config `default.dataset`); a function, so that parsing the
    # workflow does not load every experiment file
    input:
        lambda wc: [f"results/{config['default']['dataset']}/exp/{e.name}/table.md"
                    for e in list_experiments(dataset=config["default"]["dataset"])],
