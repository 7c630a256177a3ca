# The one train -> score chain of every run (recipes, experiment variants, benchmark variants x seeds):
# runs/{dataset}/{run}/ with {run} a run key (xmr.run.layout.RunKey). `xmr train --run` resolves the run's config
# from its key; the DDP launch, feature sources and features.dir hold for every kind alike.


rule train:
    input:
        unpack(inputs_of("train")),
    output:
        ckpt="runs/{dataset}/{run}/best.pt",
        summary="runs/{dataset}/{run}/train.json",
    threads: train_res("threads")
    params:
        launch=train_res("launch"),
        # the training's log, appended by `xmr train --log` (the epochs before a Ctrl-C or a kill stay above the
        # resumed run's); not a `log:`, which Snakemake deletes before each run of the job
        log="logs/train/{dataset}_{run}.log",
    resources:
        gpu=train_res("gpu"),
        gres=train_res("gres"),
        nodes=train_res("nodes"),
        tasks=train_res("tasks"),
        tasks_per_gpu=train_res("tasks_per_gpu"),
        mpi=train_res("mpi"),
        mem_mb=train_res("mem_mb"),
        runtime=train_res("runtime"),
        cpus_per_task=train_res("cpus_per_task"),
    shell:
        # the epoch lines go to the terminal too (make demo is not silent while it trains)
        # --threads: the cores Snakemake gives the job (fewer with --cores 1), torch's CPU threads
        "{XMR} train --run runs/{wildcards.dataset}/{wildcards.run}{params.launch} --threads {threads} --no-progress"
        " --log {params.log}"


# A recipe with a checkpoint: section names a published model instead of a training run: its run directory is
# imported (`xmr import-checkpoint`), never trained (docs/checkpoints.md).
ruleorder: import_checkpoint > train


rule import_checkpoint:
    input:
        unpack(lambda wc: checkpoint_inputs(wc.dataset, wc.recipe)),
    output:
        ckpt=f"runs/{{dataset}}/{{recipe,{checkpoint_recipe_pattern()}}}/best.pt",
    log:
        "logs/import/{dataset}_{recipe}_checkpoint.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("light", "runtime"),
        cpus_per_task=res("light", "cpus_per_task"),
    shell:
        "{XMR} import-checkpoint --recipe {input.config} --out runs/{wildcards.dataset}/{wildcards.recipe}"
        " > {log} 2>&1"


rule score:
    input:
        unpack(inputs_of("score")),
    output:
        "runs/{dataset}/{run}/test_sims.npy",
    log:
        "logs/score/{dataset}_{run}.log",
    resources:
        gpu=res("score", "gpu"),
        mem_mb=res("score", "mem_mb"),
        runtime=res("score", "runtime"),
        cpus_per_task=res("score", "cpus_per_task"),
    shell:
        "{XMR} score --run runs/{wildcards.dataset}/{wildcards.run} --out {output} --no-progress > {log} 2>&1"
