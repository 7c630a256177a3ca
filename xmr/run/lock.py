"""A run directory has one writer: :class:`RunLock`, held by the trainer for its lifetime.

The lock is ``fcntl.flock`` on ``{run_dir}/train.lock``, a small JSON file naming the holder (host, pid, start
time). The kernel releases a flock when its process dies, however it dies, so a lock file whose flock is free
was left by a dead writer and is taken over (with a log line); a held one makes a second writer fail at once
with one line naming the holder. The file is written atomically (a complete temporary file, locked before it is
renamed into place), and removed when the holder finishes.

One lock per training: the process that starts the others (``xmr train --nproc-per-node N``) takes it and tells
its children so through :data:`HELD_ENV`; without such a launcher (torchrun, srun) rank 0 takes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Iterator

from xmr.core.errors import XmrError
from xmr.core.io import check_writable_dir, remove_stale_temps

LOCK_NAME = "train.lock"
#: set by the launcher for the processes it starts: the resolved run directory whose lock it holds
HELD_ENV = "XMR_RUN_LOCK_HELD"


def _holder_text(info: dict | None) -> str:
    if not info:
        return "an unknown process (its lock file is unreadable)"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("started", 0)))
    return f"host {info.get('host', '?')}, pid {info.get('pid', '?')} (started {started})"


def read_holder(run_dir: str | os.PathLike) -> dict | None:
    """The holder recorded in ``run_dir``'s lock file (``host``, ``pid``, ``started``), or None."""
    try:
        return json.loads((Path(run_dir) / LOCK_NAME).read_text())
    except (OSError, ValueError):
        return None


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


class RunLock:
    """Exclusive writer lock of a run directory; a context manager (``with RunLock(out): ...``)."""

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self._fd: int | None = None
        self._created: list[Path] = []

    def acquire(self) -> "RunLock":
        check_writable_dir(self.run_dir, "training output directory (--out-dir)")
        missing = self.run_dir
        while not missing.exists():  # the directories this lock creates: removed again if nothing else is written
            self._created.append(missing)
            missing = missing.parent
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(10):  # a retry only when another process replaced or removed the file meanwhile
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise XmrError(f"{self.path}: cannot open the run's lock file ({e.strerror or e})") from None
            if not _try_flock(fd):
                os.close(fd)
                holder = _holder_text(read_holder(self.run_dir))
                raise XmrError(f"{self.run_dir} is being written by another training: {holder}; wait for it, "
                               f"or stop that process first")
            if not self._same_file(fd):  # we locked a file that was renamed over or removed in between
                os.close(fd)
                continue
            remove_stale_temps(self.path)  # a writer killed inside _write_holder; nobody else is in it now
            previous = read_holder(self.run_dir)
            if previous and previous.get("pid") is not None:  # a lock file whose flock nobody holds
                print(f"{self.path}: taking over the lock of a writer that is gone ({_holder_text(previous)})",
                      flush=True)
            self._fd = self._write_holder(fd)
            return self
        raise XmrError(f"{self.path}: the lock file keeps changing under us; is another training starting?")

    def _same_file(self, fd: int) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def _write_holder(self, old_fd: int) -> int:
        """Write the holder atomically: a complete temporary file, locked, renamed over the lock file (still
        locked too, so nobody slips in between); returns the new file's descriptor (the one that stays locked)."""
        info = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
        fd, tmp = tempfile.mkstemp(prefix=f".{LOCK_NAME}.", suffix=".tmp", dir=self.run_dir)
        try:
            os.write(fd, (json.dumps(info) + "\n").encode())
            os.fsync(fd)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nobody else can hold it
            os.replace(tmp, self.path)
        except BaseException:
            os.close(fd)
            Path(tmp).unlink(missing_ok=True)
            os.close(old_fd)
            raise
        os.close(old_fd)  # releases the old inode's flock: whoever opened it finds it replaced and retries
        return fd

    def release(self) -> None:
        if self._fd is None:
            return
        if self._same_file(self._fd):  # remove it while still holding it: a finished run leaves no lock file
            self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None
        for d in self._created:  # a training that failed before writing anything leaves no directory behind
            try:
                d.rmdir()
            except OSError:  # not empty: the run's files, or another process's
                break
        self._created = []

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def process_run_lock(run_dir: str | os.PathLike, rank: int) -> contextlib.AbstractContextManager:
    """The lock this process of a training takes: :class:`RunLock` on rank 0 unless the launcher that started it
    holds it already (:data:`HELD_ENV`); nothing on the other ranks."""
    if rank != 0 or os.environ.get(HELD_ENV) == str(Path(run_dir).resolve()):
        return contextlib.nullcontext()
    return RunLock(run_dir)


@contextlib.contextmanager
def launcher_run_lock(run_dir: str | os.PathLike) -> Iterator[None]:
    """Held by a launcher for the training it starts; its children see :data:`HELD_ENV` and take no lock."""
    with RunLock(run_dir):
        os.environ[HELD_ENV] = str(Path(run_dir).resolve())
        try:
            yield
        finally:
            os.environ.pop(HELD_ENV, None)
