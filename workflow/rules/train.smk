# Training (one run directory per dataset x recipe) and the test-split similarity matrix.


def train_procs(wc):
    """(processes per node, nodes) of a training job: one DDP process per GPU (config `resources`: `gpu` is
    GPUs per node, `nodes` defaults to 1)."""
    gpus = res("train", "gpu")(wc)
    per_dataset = config["resources"].get(wc.dataset, {}).get("train", {})
    nodes = per_dataset.get("nodes", config["resources"]["default"]["train"].get("nodes", 1))
    return max(gpus, 1), nodes


def train_multi(wc):
    per_node, nodes = train_procs(wc)
    return per_node * nodes > 1


def train_gpu(wc):
    # one node: --gpus=N; several nodes: gres (per node) instead, since --gpus counts GPUs over all nodes
    per_node, nodes = train_procs(wc)
    return res("train", "gpu")(wc) if nodes == 1 else None


def train_gres(wc):
    per_node, nodes = train_procs(wc)
    return f"gpu:{per_node}" if nodes > 1 and res("train", "gpu")(wc) > 0 else None


def train_launch(wc):
    """`xmr train` options for DDP; with SLURM, resources `mpi`/`tasks` make the job step run the rule's command
    once in the allocation (not under `srun -n1`), and `xmr train` starts the tasks itself with srun."""
    per_node, nodes = train_procs(wc)
    return f" --nproc-per-node {per_node} --nnodes {nodes}" if per_node * nodes > 1 else ""


rule train:
    input:
        unpack(train_inputs),
    output:
        ckpt="runs/{dataset}/{recipe}/best.pt",
        summary="runs/{dataset}/{recipe}/train.json",
    log:
        "logs/train/{dataset}_{recipe}.log",
    threads: res("train", "cpus_per_task")
    params:
        launch=train_launch,
    resources:
        gpu=train_gpu,
        gres=train_gres,
        nodes=lambda wc: train_procs(wc)[1] if train_multi(wc) else None,
        tasks=lambda wc: train_procs(wc)[0] * train_procs(wc)[1] if train_multi(wc) else None,
        tasks_per_gpu=lambda wc: 1 if train_multi(wc) and res("train", "gpu")(wc) > 0 else None,
        mpi=lambda wc: "srun" if train_multi(wc) else None,
        mem_mb=res("train", "mem_mb"),
        runtime=res("train", "runtime"),
        cpus_per_task=res("train", "cpus_per_task"),
    shell:
        "{XMR} train --config {input.config} --out-dir runs/{wildcards.dataset}/{wildcards.recipe}"
        "{params.launch} --no-progress > {log} 2>&1"


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
        unpack(score_inputs),
    output:
        "runs/{dataset}/{recipe}/test_sims.npy",
    log:
        "logs/score/{dataset}_{recipe}.log",
    resources:
        gpu=res("score", "gpu"),
        mem_mb=res("score", "mem_mb"),
        runtime=res("score", "runtime"),
        cpus_per_task=res("score", "cpus_per_task"),
    shell:
        "{XMR} score --run runs/{wildcards.dataset}/{wildcards.recipe} --out {output} --no-progress > {log} 2>&1"
