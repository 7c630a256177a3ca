"""``xmr`` command line: one subcommand per module in :mod:`xmr.commands`, each a thin wrapper over a library call.

A command module defines ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int | None``;
modules are discovered automatically, so adding a command is adding a file. Heavy imports happen inside
``run`` so that ``xmr --help`` stays fast.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import pkgutil
import sys
from typing import NoReturn, Sequence

import xmr.commands
from xmr import __version__
from xmr.core.errors import XmrError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xmr", description="Image-text cross-modal retrieval pipeline.")
    parser.add_argument("--version", action="version", version=f"xmr {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for info in sorted(pkgutil.iter_modules(xmr.commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"xmr.commands.{info.name}")
        name = getattr(mod, "NAME", info.name.replace("_", "-"))
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from xmr.core.reproducibility import portable_cpu_numerics

    portable_cpu_numerics()  # before anything imports torch: the AVX2 pins where XMR_PORTABLE_CPU=1 asks for them
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = args._run(args)
    except XmrError as e:
        print(f"xmr {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM while a run is tracked (xmr.run.tracking.Terminated)
        print(f"xmr {args.command}: interrupted", file=sys.stderr)
        return 128 + getattr(e, "signum", 2)  # the shell's status for death by that signal: 130 SIGINT, 143 SIGTERM
    return int(rc or 0)


def entry_point() -> NoReturn:
    """The process's entry (``xmr``, ``python -m xmr``): :func:`main`, then exit with its status. ``gc.freeze()``
    first keeps what the command leaves behind out of the interpreter's last garbage collection, which would scan
    torch's, MLflow's and SQLAlchemy's object graphs: up to 2 s at the end of an ``xmr train``. Exit handlers,
    thread joins and module teardown still run."""
    rc = main()
    gc.freeze()
    sys.exit(rc)


if __name__ == "__main__":
    entry_point()
