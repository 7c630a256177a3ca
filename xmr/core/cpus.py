"""The CPUs a process may use (no torch: the workflow's planning and the re-rankers' NumPy paths read it too)."""

from __future__ import annotations

import os


def available_cpus() -> int:
    """The CPUs this process may run on: its affinity (a SLURM job's allocation, a `taskset`), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity API (macOS)
        return os.cpu_count() or 1


def _cpu_ticks() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat; None where there is none."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_cpus(interval: float = 0.2) -> float | None:
    """How many CPUs the machine kept busy over the next ``interval`` seconds (this process sleeps meanwhile, so it
    is other programs' work); None where the kernel does not say (no /proc/stat)."""
    import time

    a = _cpu_ticks()
    time.sleep(interval)
    b = _cpu_ticks()
    if a is None or b is None or b[1] <= a[1]:
        return None
    return (b[0] - a[0]) / (b[1] - a[1]) * (os.cpu_count() or 1)


def wait_policy_for(threads: int | None, busy: float | None, cpus: int) -> str | None:
    """OpenMP's wait policy for a job of ``threads`` threads on a machine of ``cpus`` CPUs of which ``busy`` are held
    by others (the machine's, not the job's allocation: on a cluster node other jobs' cores are not this job's):
    ``PASSIVE`` (threads that wait sleep) when the others leave fewer free CPUs than the job's threads, where a
    spinning thread would hold a core another program needs and every step would wait on it (measured on 2 cores
    with two busy loops beside a demo epoch: 48 s asleep, over 150 s spinning); None (OpenMP's default, a short
    spin) on a free machine, where sleeping threads cost about 40 % (demo epochs of 25 against 15 s)."""
    if busy is None:
        return None
    wanted = threads or cpus
    return "PASSIVE" if cpus - busy < wanted - 0.5 else None
