"""``xmr ARGS`` in a process forked from a server that has already imported torch, MLflow and xmr.

A test that kills an ``xmr`` process, or starts several at once, needs separate processes; each fresh interpreter
spent about 5 s of CPU importing torch, ``torch._dynamo`` (which the optimizer's first step imports) and MLflow
before its first line of work. This module starts one :mod:`multiprocessing` fork server per pytest worker, with
those modules imported in the environment of :func:`conftest.xmr_env`, and forks each command from it: a real
process (its own pid, files, locks and exit status; SIGKILL kills it alone) that runs ``xmr.cli.main(ARGS)`` and
exits as the ``xmr`` entry point does (non-daemon threads joined, exit handlers run, streams flushed).

The environment of a forked command may differ from the server's, except in what is read as a process starts
(:data:`IMPORT_TIME`: thread counts, CPU pins, ``PYTHONPATH``, plugins), which needs a fresh interpreter,
``conftest.run_xmr_process``. No pytest import here: the fork server imports this module.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: what the fork server imports once, so that no forked command imports it again
PRELOAD = ["torch", "torch._dynamo", "mlflow", "mlflow.store.tracking.sqlalchemy_store", "xmr.cli",
           "xmr.train.trainer", "xmr.features.extract", "forked_xmr"]
#: what torch, its math libraries, Python and xmr read as a process starts (thread counts, instruction sets, the
#: module path, plugins): a forked command would not see a change to these, so it needs a fresh interpreter
IMPORT_TIME = ("OMP_", "MKL_", "ATEN_", "ONEDNN_", "DNNL_", "OPENBLAS_", "PYTHON", "LD_", "XMR_PLUGINS",
               "XMR_PORTABLE_CPU", "XMR_NATIVE_CPU")

_server_env: dict[str, str] | None = None


def main_status(argv: list[str]) -> int:
    """``xmr.cli.main(ARGS)`` and the exit status the interpreter would give it: argparse's exits (``--help`` 0, a
    usage error 2, its message on stderr), an uncaught exception's traceback on stderr and status 1."""
    import traceback

    from xmr import cli

    try:
        return cli.main(argv)
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except Exception:  # noqa: BLE001 - as the interpreter reports an uncaught exception
        traceback.print_exc()
        return 1


def _child(argv: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """The forked process: stdout and stderr to files, then ``xmr ARGS`` as the entry point runs it."""
    import atexit
    import threading

    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    # as an interpreter writing to a pipe: stdout block-buffered, stderr line-buffered
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False, buffering=1)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.argv = ["xmr", *argv]
    rc = main_status(argv)
    threading._shutdown()  # what the interpreter does at exit, in its order
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


class ForkedXmr:
    """A running forked ``xmr`` command: :meth:`poll`, :meth:`kill`, :meth:`wait`."""

    def __init__(self, argv: list[str], cwd: str, env: dict[str, str]) -> None:
        self.argv = argv
        self._dir = Path(tempfile.mkdtemp(prefix="xmr-forked-"))
        self._out, self._err = self._dir / "stdout", self._dir / "stderr"
        ctx = multiprocessing.get_context("forkserver")
        self.process = ctx.Process(target=_child, args=(argv, cwd, env, str(self._out), str(self._err)))
        self.process.start()
        self.pid = self.process.pid

    def poll(self) -> int | None:
        """The exit status (negative: killed by that signal), None while it runs."""
        return self.process.exitcode

    def kill(self) -> None:
        self.process.kill()

    def terminate(self) -> None:
        """SIGTERM, as Snakemake cancelling a job or SLURM's time limit sends it."""
        self.process.terminate()

    def wait(self, timeout: float = 600) -> subprocess.CompletedProcess:
        """Until it exits (killed after ``timeout`` seconds: an AssertionError); what it printed and its status."""
        self.process.join(timeout)
        timed_out = self.process.exitcode is None
        if timed_out:
            self.process.kill()
            self.process.join()
        out, err = (p.read_text(errors="replace") if p.exists() else "" for p in (self._out, self._err))
        shutil.rmtree(self._dir, ignore_errors=True)
        assert not timed_out, f"xmr {' '.join(self.argv)}: not done after {timeout} s\n{out[-2000:]}{err[-2000:]}"
        return subprocess.CompletedProcess(["xmr", *self.argv], self.process.exitcode, out, err)


def start(args, cwd: str | os.PathLike | None, env: dict[str, str], server_env: dict[str, str]) -> ForkedXmr:
    """Fork ``xmr ARGS`` in ``cwd`` (default: this process's) with ``env``. The first call starts the fork server
    with ``server_env``; ``env`` may differ from it in anything but :data:`IMPORT_TIME`."""
    global _server_env
    if _server_env is None:
        multiprocessing.set_forkserver_preload(PRELOAD)
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(server_env)  # the server's environment, before it imports torch (threads, ISA)
        try:
            from multiprocessing import forkserver

            forkserver.ensure_running()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        _server_env = dict(server_env)
    differ = sorted(k for k in set(env) | set(_server_env) if env.get(k) != _server_env.get(k) and
                    k.startswith(IMPORT_TIME))
    assert not differ, f"{differ} are read as a process starts: run this command in a fresh interpreter"
    return ForkedXmr([str(a) for a in args], str(cwd or os.getcwd()), dict(env))
