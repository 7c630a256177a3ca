# Experiments: sweeps and ablations as data (config/experiments/{experiment}.yaml; docs/report.md).
# Each variant of a recipe is a run (run key exp/{experiment}/{variant}): trained, scored and evaluated by the
# one chain (train.smk, evaluate.smk) into results/{dataset}/exp/{experiment}/{variant}[_{reranker}].json;
# `experiment_table` gathers them into table.md/table.csv/figure.png. An experiment of existing recipes (`recipes:`) reuses results/{dataset}/*.json.
#
#   snakemake -c2 results/synth/exp/dvse_k_sweep/table.md     # one experiment
#   snakemake -c2 experiments                                  # every experiment of the default dataset

from xmr.planning.workflow_inputs import announce_trainings, planned_runs
from xmr.studies.experiments import list_experiments, load_experiment, resolve_variant


wildcard_constraints:
    experiment="[a-z0-9_]+",
    variant="[a-z0-9_]+",


def experiment_file(wc):
    return f"config/experiments/{wc.experiment}.yaml"


def experiment_of(wc):
    exp = load_experiment(experiment_file(wc))
    exp.check_dataset(wc.dataset)
    return exp


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
