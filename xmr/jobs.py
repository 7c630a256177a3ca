"""What a workflow job asks the scheduler for: resources per job kind (config ``resources``, per dataset, per
split for extraction) and the DDP launch of a training job (processes per node x nodes). The Snakemake rules
read these through ``workflow/rules/common.smk``; tested in tests/test_run_key.py and tests/test_doctor.py."""

from __future__ import annotations

import os
from typing import Any

from xmr.errors import XmrError

#: job kind -> the kind its evaluation-split jobs use (val/test are ~5,000 images, COCO's train 113,287)
EVAL_KINDS = {"extract": "extract_eval"}


def job_resource(resources: dict, kind: str, key: str, dataset: str = "", split: str = "") -> Any:
    """Resource ``key`` of a ``kind`` job from config ``resources``: the dataset's own entry, else ``default``.
    Jobs on a split other than ``train`` use ``{kind}_eval`` when there is one (the dataset's ``{kind}_eval``,
    then its ``{kind}``, then ``default.{kind}_eval``, then ``default.{kind}``)."""
    per_dataset = resources.get(dataset, {}) or {}
    default = resources["default"]
    kinds = [kind]
    if split and split != "train" and kind in EVAL_KINDS:
        kinds = [EVAL_KINDS[kind], kind]
    for table in (per_dataset, default):
        for k in kinds:
            if key in (table.get(k) or {}):
                return table[k][key]
    raise XmrError(f"config/config.yaml: resources.default.{kind}.{key} is not set")


def available_cpus() -> int:
    """The CPUs this process may run on: its affinity (a SLURM job's allocation, a `taskset`), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity API (macOS)
        return os.cpu_count() or 1


#: the most decoding processes an extraction starts by itself: a hand run on a large shared node (no affinity)
#: would otherwise start one per core, each with its own copy of the loader's state
MAX_EXTRACT_WORKERS = 16


def extract_workers(cpus: int) -> int:
    """Image-decoding processes of an extraction job with ``cpus`` CPUs: one fewer, since the main process needs
    a CPU to run the network (or to feed the GPU), and at most :data:`MAX_EXTRACT_WORKERS`. On one CPU that is 0:
    decoding in the main process, which is faster than a worker competing with it for the same core
    (docs/benchmarks.md "Feature extraction")."""
    return min(max(int(cpus) - 1, 0), MAX_EXTRACT_WORKERS)


def train_procs(resources: dict, dataset: str) -> tuple[int, int]:
    """(processes per node, nodes) of a training job: one DDP process per GPU (``gpu`` is GPUs per node,
    ``nodes`` defaults to 1)."""
    gpus = job_resource(resources, "train", "gpu", dataset)
    per_dataset = (resources.get(dataset) or {}).get("train") or {}
    nodes = per_dataset.get("nodes", (resources["default"].get("train") or {}).get("nodes", 1))
    return max(int(gpus), 1), int(nodes)


def train_job(resources: dict, dataset: str, threads: int | None = None) -> dict[str, Any]:
    """The scheduler request and the ``xmr train`` launch options of a training job on ``dataset``, the same for
    every run kind (recipe, experiment variant, benchmark variant): ``launch`` (``--nproc-per-node N --nnodes M``
    when there are several processes) and the resources. One node: ``gpu`` (``--gpus=N``); several nodes: ``gres``
    per node instead (``--gpus`` counts GPUs over all nodes). With several processes, ``mpi``/``tasks`` make the
    SLURM job step run the rule's command once in the allocation, and ``xmr train`` starts the tasks with srun.
    ``threads``: a run's own ``train.threads`` (the benchmark's one-thread trainings), else the resources'."""
    per_node, nodes = train_procs(resources, dataset)
    gpus = job_resource(resources, "train", "gpu", dataset)
    multi = per_node * nodes > 1
    cpus = threads or job_resource(resources, "train", "cpus_per_task", dataset)
    return {
        "launch": f" --nproc-per-node {per_node} --nnodes {nodes}" if multi else "",
        "threads": cpus,
        "gpu": gpus if nodes == 1 else None,
        "gres": f"gpu:{per_node}" if nodes > 1 and gpus > 0 else None,
        "nodes": nodes if multi else None,
        "tasks": per_node * nodes if multi else None,
        "tasks_per_gpu": 1 if multi and gpus > 0 else None,
        "mpi": "srun" if multi else None,
        "mem_mb": job_resource(resources, "train", "mem_mb", dataset),
        "runtime": job_resource(resources, "train", "runtime", dataset),
        "cpus_per_task": cpus,
    }
