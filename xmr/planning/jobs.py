"""What a workflow job asks the scheduler for: resources per job kind (config ``resources``, per dataset, per
split for extraction; a dataset without an entry gets ``default``, the local CPU setting) and the DDP launch of a
training job (processes per node x nodes). The Snakemake rules read these through ``workflow/rules/common.smk``;
tested in tests/test_run_key.py and tests/test_doctor.py."""

from __future__ import annotations

from typing import Any

from xmr.core.errors import XmrError

#: job kind -> the kind its evaluation-split jobs use (val/test are ~5,000 images, COCO's train 113,287)
EVAL_KINDS = {"extract": "extract_eval"}


def resource_tables(resources: dict, dataset: str) -> list[dict]:
    """The tables of config ``resources`` a ``dataset``'s jobs read, first match wins: its own entry, the table its
    ``like:`` names (``coco: {like: gpu_cluster}``), then ``default`` (a dataset without an entry, e.g. your own:
    the local CPU setting)."""
    own = resources.get(dataset) or {}
    like = (resources.get(own["like"]) or {}) if own.get("like") else {}
    return [own, like, resources["default"]]


def check_resources(resources: dict, src: str = "config/config.yaml") -> None:
    """Every ``like:`` of config ``resources`` names another table there, which has no ``like:`` of its own."""
    copyable = [k for k, v in resources.items() if k != "default" and not (v or {}).get("like")]
    for name, table in resources.items():
        like = (table or {}).get("like")
        if like is None:
            continue
        if name == "default":
            raise XmrError(f"{src}: resources.default.like: default is what every dataset falls back to; remove like "
                           f"there")
        if like == name or like not in copyable:
            raise XmrError(f"{src}: resources.{name}.like: {like!r} is not a table to copy; name one of: "
                           f"{', '.join(k for k in copyable if k != name)}")


def job_resource(resources: dict, kind: str, key: str, dataset: str = "", split: str = "") -> Any:
    """Resource ``key`` of a ``kind`` job from config ``resources``, from the dataset's tables
    (:func:`resource_tables`: its own entry, its ``like:``, ``default``). Jobs on a split other than ``train`` use
    ``{kind}_eval`` when a table has it (a table's ``{kind}_eval``, then its ``{kind}``, then the next table's)."""
    kinds = [kind]
    if split and split != "train" and kind in EVAL_KINDS:
        kinds = [EVAL_KINDS[kind], kind]
    for table in resource_tables(resources, dataset):
        for k in kinds:
            if key in (table.get(k) or {}):
                return table[k][key]
    raise XmrError(f"config/config.yaml: resources.default.{kind}.{key} is not set")


#: the most decoding processes an extraction starts by itself: a hand run on a large shared node (no affinity)
#: would otherwise start one per core, each with its own copy of the loader's state
MAX_EXTRACT_WORKERS = 16


def extract_workers(cpus: int) -> int:
    """Image-decoding processes of an extraction job with ``cpus`` CPUs: one fewer, since the main process needs
    a CPU to run the network (or to feed the GPU), and at most :data:`MAX_EXTRACT_WORKERS`. On one CPU that is 0:
    decoding in the main process, which is faster than a worker competing with it for the same core
    (docs/speed.md "Feature extraction")."""
    return min(max(int(cpus) - 1, 0), MAX_EXTRACT_WORKERS)


def train_procs(resources: dict, dataset: str) -> tuple[int, int]:
    """(processes per node, nodes) of a training job: one DDP process per GPU (``gpu`` is GPUs per node,
    ``nodes`` defaults to 1)."""
    gpus = job_resource(resources, "train", "gpu", dataset)
    nodes = next((t["train"]["nodes"] for t in resource_tables(resources, dataset)
                  if "nodes" in (t.get("train") or {})), 1)
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
