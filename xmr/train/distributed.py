"""DistributedDataParallel: set-up inside each process, and the launcher that starts the processes.

Three ways one training reaches several processes; the trainer code is the same for all:

- ``torchrun --standalone --nproc_per_node=N -m xmr train ...`` sets ``WORLD_SIZE``/``RANK``/``LOCAL_RANK``.
- ``srun python -m xmr train ...`` inside a SLURM allocation: :func:`setup` maps ``SLURM_NTASKS``/
  ``SLURM_PROCID``/``SLURM_LOCALID`` to the torchrun variables.
- ``xmr train --nproc-per-node N [--nnodes M]`` (what the Snakemake train rule runs when config/config.yaml
  asks for several GPUs): :func:`launch_command` builds the srun line (inside a SLURM job) or the torchrun line
  (elsewhere, one node) that starts the processes again with the same arguments.

Single process (no WORLD_SIZE / SLURM_NTASKS > 1) is the default and needs nothing.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from typing import Callable, Sequence, TypeVar

import torch
import torch.distributed as torch_dist
from torch.utils.data import Dataset, DistributedSampler

from xmr.core.errors import XmrError

T = TypeVar("T")

# set by the launcher in the processes it starts, so they train instead of launching again
CHILD_ENV = "XMR_DIST_CHILD"
LAUNCHERS = ("auto", "srun", "torchrun")


@dataclass
class DistContext:
    enabled: bool = False
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        if not self.enabled:
            return model
        ids = [self.device.index] if self.device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids, find_unused_parameters=True)

    def sampler(self, dataset: Dataset, seed: int) -> DistributedSampler | None:
        if not self.enabled:
            return None
        return DistributedSampler(dataset, num_replicas=self.world_size, rank=self.rank, shuffle=True, seed=seed)

    def barrier(self) -> None:
        if self.enabled:
            torch_dist.barrier()

    def from_main(self, compute: Callable[[], T]) -> T:
        """``compute()`` run on rank 0 only, its (picklable) result sent to every process: e.g. hashing the
        training store once instead of once per process (each would read the whole file)."""
        if not self.enabled:
            return compute()
        box = [compute() if self.is_main else None]
        torch_dist.broadcast_object_list(box, src=0)
        return box[0]


class _GatherWithGrad(torch.autograd.Function):
    """all_gather along dim 0 whose backward sends each process the summed gradient of its own rows (every
    process computes the same loss on the gathered batch, so DDP's gradient average then equals the gradient of
    that loss). all_reduce + slice instead of reduce_scatter: gloo has no reduce_scatter."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        world, rank = torch_dist.get_world_size(), torch_dist.get_rank()
        sizes = [torch.zeros(1, dtype=torch.long, device=x.device) for _ in range(world)]
        torch_dist.all_gather(sizes, torch.tensor([x.shape[0]], device=x.device))
        sizes = [int(n) for n in sizes]
        if len(set(sizes)) != 1:
            raise XmrError(f"train.gather_negatives: processes have different batch sizes {sizes}")
        parts = [torch.empty_like(x) for _ in range(world)]
        torch_dist.all_gather(parts, x.contiguous())
        ctx.rank, ctx.rows = rank, x.shape[0]
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous().clone()
        torch_dist.all_reduce(grad)
        return grad[ctx.rank * ctx.rows:(ctx.rank + 1) * ctx.rows]


def gather_batch(x: torch.Tensor) -> torch.Tensor:
    """The rows of ``x`` from every process, in rank order (differentiable; a no-op without DDP)."""
    if not (torch_dist.is_available() and torch_dist.is_initialized()) or torch_dist.get_world_size() == 1:
        return x
    if not x.requires_grad:
        parts = [torch.empty_like(x) for _ in range(torch_dist.get_world_size())]
        torch_dist.all_gather(parts, x.contiguous())
        return torch.cat(parts)
    return _GatherWithGrad.apply(x)


def expand_nodelist(nodelist: str) -> list[str]:
    """Host names of a SLURM nodelist: ``gpu[01-03,07],login1`` -> ``[gpu01, gpu02, gpu03, gpu07, login1]``
    (zero padding kept; what ``scontrol show hostnames`` prints, without needing scontrol)."""
    hosts: list[str] = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", nodelist):
        if plain:
            hosts.append(plain)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if not hi:
                hosts.append(prefix + lo)
            else:
                hosts.extend(f"{prefix}{i:0{len(lo)}d}" for i in range(int(lo), int(hi) + 1))
    return hosts


def _env_from_slurm() -> None:
    """Map srun's SLURM_* variables to the torchrun ones when launched by ``srun python -m xmr train``.
    Only inside an srun step (``SLURM_STEP_ID``): the batch script of an ``sbatch --ntasks=N`` job also carries
    ``SLURM_NTASKS=N`` and ``SLURM_PROCID=0`` but is one process, and must not wait for N - 1 peers."""
    if "WORLD_SIZE" in os.environ or "SLURM_STEP_ID" not in os.environ \
            or int(os.environ.get("SLURM_NTASKS", "1")) <= 1:
        return
    os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
    os.environ["RANK"] = os.environ["SLURM_PROCID"]
    os.environ["LOCAL_RANK"] = os.environ.get("SLURM_LOCALID", "0")
    if "MASTER_ADDR" not in os.environ:
        nodes = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST") or "127.0.0.1"
        os.environ["MASTER_ADDR"] = expand_nodelist(nodes)[0]
    # one port per job, so two jobs sharing a node do not collide
    os.environ.setdefault("MASTER_PORT", str(29500 + int(os.environ.get("SLURM_JOB_ID", "0")) % 1000))


def process_rank() -> int:
    """This process's rank (0 outside DDP), known before :func:`setup` (e.g. to take the run's lock on rank 0)."""
    _env_from_slurm()
    return int(os.environ.get("RANK", "0")) if int(os.environ.get("WORLD_SIZE", "1")) > 1 else 0


def setup() -> DistContext:
    _env_from_slurm()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext()
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        # each process sees either all of the node's GPUs (index = local rank) or only its own (SLURM GPU
        # binding, --ntasks-per-gpu): the modulo covers both
        index = local % torch.cuda.device_count()
        torch.cuda.set_device(index)
        device, backend = torch.device("cuda", index), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not torch_dist.is_initialized():
        torch_dist.init_process_group(backend=backend)
    return DistContext(True, rank, world, local, device)


def cleanup(ctx: DistContext) -> None:
    if ctx.enabled and torch_dist.is_initialized():
        torch_dist.destroy_process_group()


# --- launching -----------------------------------------------------------------------------------------------

def already_launched(env: dict[str, str] | None = None) -> bool:
    """True in a process some launcher started (ours, torchrun, or a hand-written ``srun -n N``)."""
    env = os.environ if env is None else env
    return (env.get(CHILD_ENV) == "1" or int(env.get("WORLD_SIZE", "1")) > 1
            or ("SLURM_STEP_ID" in env and int(env.get("SLURM_NTASKS", "1")) > 1))


def resolve_launcher(launcher: str, env: dict[str, str] | None = None) -> str:
    """``auto`` -> ``srun`` inside a SLURM job (``SLURM_JOB_ID`` set and srun on PATH), else ``torchrun``."""
    env = os.environ if env is None else env
    if launcher not in LAUNCHERS:
        raise XmrError(f"--launcher {launcher}: unknown; use one of {', '.join(LAUNCHERS)}")
    if launcher != "auto":
        return launcher
    return "srun" if env.get("SLURM_JOB_ID") and shutil.which("srun") else "torchrun"


def launch_command(xmr_args: Sequence[str], nproc_per_node: int, nnodes: int = 1, launcher: str = "auto",
                   cpus_per_task: int | None = None, python: str | None = None,
                   env: dict[str, str] | None = None) -> list[str]:
    """The command that runs ``python -m xmr {xmr_args}`` as ``nproc_per_node x nnodes`` DDP processes."""
    if nproc_per_node < 1 or nnodes < 1:
        raise XmrError(f"--nproc-per-node {nproc_per_node} --nnodes {nnodes}: both must be >= 1")
    python = python or sys.executable
    kind = resolve_launcher(launcher, env)
    world = nproc_per_node * nnodes
    if kind == "srun":
        if cpus_per_task is None:
            # the SLURM executor's job step drops SLURM_CPUS_PER_TASK; the CPUs this batch step may use are
            # the job's CPUs on this node, shared by its tasks
            cpus_per_task = max(1, len(os.sched_getaffinity(0)) // nproc_per_node)
        return ["srun", f"--ntasks={world}", f"--nodes={nnodes}", f"--ntasks-per-node={nproc_per_node}",
                f"--cpus-per-task={cpus_per_task}", "--kill-on-bad-exit=1", python, "-m", "xmr", *xmr_args]
    if nnodes > 1:
        raise XmrError(f"--nnodes {nnodes}: training on several nodes needs SLURM (run it with the SLURM profile "
                       f"or inside salloc, so that srun starts the processes); torchrun here starts one node only")
    return [python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc_per_node}",
            "-m", "xmr", *xmr_args]


def relaunch(xmr_args: Sequence[str], nproc_per_node: int, nnodes: int = 1, launcher: str = "auto") -> int:
    """Run ``xmr {xmr_args}`` as DDP processes and wait; returns the launcher's exit code."""
    import subprocess

    cmd = launch_command(xmr_args, nproc_per_node, nnodes, launcher)
    env = dict(os.environ, **{CHILD_ENV: "1"})
    print("launching:", " ".join(cmd), flush=True)
    return subprocess.run(cmd, env=env).returncode
