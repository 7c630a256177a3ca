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
from pathlib import Path
from typing import NoReturn, Sequence

import xmr.commands
from xmr import __version__
from xmr.core.errors import XmrError, shown_path


class XmrArgumentParser(argparse.ArgumentParser):
    """argparse, but a mistake on the command line (a misspelt choice, a missing argument) is one line, as every
    other xmr error, pointing to ``--help`` instead of printing the whole usage text first."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def build_parser() -> argparse.ArgumentParser:
    parser = XmrArgumentParser(prog="xmr", description="Image-text cross-modal retrieval pipeline.")
    parser.add_argument("--version", action="version", version=f"xmr {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for info in sorted(pkgutil.iter_modules(xmr.commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"xmr.commands.{info.name}")
        name = getattr(mod, "NAME", info.name.replace("_", "-"))
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run, _parser=p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from xmr.core.reproducibility import portable_cpu_numerics

    portable_cpu_numerics()  # before anything imports torch: the AVX2 pins where XMR_PORTABLE_CPU=1 asks for them
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # named by the command they were given to: "xmr train: error: unrecognized arguments: ..."
        args._parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        rc = _run_noting_made_folders(args)
    except XmrError as e:
        print(f"xmr {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM while a run is tracked (xmr.run.tracking.Terminated)
        print(f"xmr {args.command}: interrupted", file=sys.stderr)
        return 128 + getattr(e, "signum", 2)  # the shell's status for death by that signal: 130 SIGINT, 143 SIGTERM
    return int(rc or 0)


def _run_noting_made_folders(args: argparse.Namespace) -> int | None:
    """The command, then one line for each output folder it made (:func:`_missing_output_folders`)."""
    missing = _missing_output_folders(args)
    rc = args._run(args)
    for option, folder in missing:
        if folder.is_dir():
            print(f"xmr {args.command}: made the folder {shown_path(folder)}/ for {option} (it did not exist)",
                  file=sys.stderr)
    return rc


def _missing_output_folders(args: argparse.Namespace) -> list[tuple[str, Path]]:
    """(option, folder) for each output option (``--out``, ``--out-dir``, ``--ranks-out``, ...) whose value's folder
    does not exist yet: every command makes it as it writes (as Snakemake does), and says so once it has, so that
    a misspelt folder does not go unnoticed."""
    found = []
    for dest, value in vars(args).items():
        if value and isinstance(value, str) and (dest == "out" or dest.startswith("out_") or dest.endswith("_out")):
            folder = Path(value).parent
            if str(folder) not in ("", ".") and not folder.exists():
                found.append(("--" + dest.replace("_", "-"), folder))
    return found


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
