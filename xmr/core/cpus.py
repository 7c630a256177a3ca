"""The CPUs a process may use (no torch: the workflow's planning and the re-rankers' NumPy paths read it too)."""

from __future__ import annotations

import os


def available_cpus() -> int:
    """The CPUs this process may run on: its affinity (a SLURM job's allocation, a `taskset`), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity API (macOS)
        return os.cpu_count() or 1
