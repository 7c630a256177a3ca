"""DistributedDataParallel set-up for ``torchrun`` (one node) and ``srun`` (SLURM, several nodes).

Single process (no WORLD_SIZE / SLURM_NTASKS > 1) is the default and needs nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as torch_dist
from torch.utils.data import Dataset, DistributedSampler


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
        ids = [self.local_rank] if self.device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids, find_unused_parameters=True)

    def sampler(self, dataset: Dataset, seed: int) -> DistributedSampler | None:
        if not self.enabled:
            return None
        return DistributedSampler(dataset, num_replicas=self.world_size, rank=self.rank, shuffle=True, seed=seed)

    def barrier(self) -> None:
        if self.enabled:
            torch_dist.barrier()


def _env_from_slurm() -> None:
    """Map srun's SLURM_* variables to the torchrun ones when launched by ``srun python -m xmr train``."""
    if "WORLD_SIZE" in os.environ or int(os.environ.get("SLURM_NTASKS", "1")) <= 1:
        return
    os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
    os.environ["RANK"] = os.environ["SLURM_PROCID"]
    os.environ["LOCAL_RANK"] = os.environ.get("SLURM_LOCALID", "0")
    if "MASTER_ADDR" not in os.environ:
        nodes = os.environ.get("SLURM_JOB_NODELIST", "127.0.0.1")
        os.environ["MASTER_ADDR"] = _first_host(nodes)
    os.environ.setdefault("MASTER_PORT", str(29500 + int(os.environ.get("SLURM_JOB_ID", "0")) % 1000))


def _first_host(nodelist: str) -> str:
    """First host of a SLURM nodelist such as ``gpu[01-04,07]`` or ``a,b``."""
    head = nodelist.split(",")[0]
    if "[" in head:
        prefix, rest = head.split("[", 1)
        return prefix + rest.rstrip("]").split("-")[0].split(",")[0]
    return head


def setup() -> DistContext:
    _env_from_slurm()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext()
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        device, backend = torch.device("cuda", local), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not torch_dist.is_initialized():
        torch_dist.init_process_group(backend=backend)
    return DistContext(True, rank, world, local, device)


def cleanup(ctx: DistContext) -> None:
    if ctx.enabled and torch_dist.is_initialized():
        torch_dist.destroy_process_group()
