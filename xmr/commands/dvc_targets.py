"""xmr dvc-targets: the Snakemake targets of the reproduced DVC stages (what `make sync` touches)."""

from __future__ import annotations

from pathlib import Path

HELP = "print the Snakemake targets of the DVC stages in dvc.lock whose files exist (for `make sync`)"


def add_arguments(p):
    p.add_argument("--lock", default="dvc.lock", help="DVC lock file (default: dvc.lock)")
    p.add_argument("--all", action="store_true", help="also targets whose files are missing")


def run(args):
    print(" ".join(dvc_snakemake_targets(args.lock, existing_only=not args.all)))


# the snakemake options of a stage command that take a value (the next word is not a target)
_VALUE_OPTIONS = {"--cores", "-c", "--jobs", "-j", "--profile", "--configfile", "--directory", "-d", "--snakefile",
                  "-s", "--executor", "-e", "--rerun-triggers"}


def dvc_snakemake_targets(lock: str | Path = "dvc.lock", existing_only: bool = True) -> list[str]:
    """The Snakemake targets of the DVC stages recorded in ``lock`` (the file arguments of each stage's
    ``snakemake ...`` command), in stage order; ``existing_only``: only those present (a clone that pulled some
    stages). What ``make sync`` marks up to date after ``dvc pull``/``dvc checkout``."""
    import shlex

    from xmr.config.loader import safe_load

    path = Path(lock)
    if not path.exists():
        from xmr.core.errors import XmrError

        raise XmrError(f"{path} not found: run `dvc repro` (or `dvc pull` in a clone of a reproduced commit) first")
    stages = (safe_load(path.read_text()) or {}).get("stages", {})
    targets: list[str] = []
    for stage in stages.values():
        words = shlex.split(stage.get("cmd", "") if isinstance(stage.get("cmd"), str) else " ".join(stage["cmd"]))
        if not words or Path(words[0]).name != "snakemake":
            continue
        skip = False
        for w in words[1:]:
            if skip:
                skip = False
            elif w.startswith("-"):
                skip = w in _VALUE_OPTIONS
            elif w not in targets and (not existing_only or Path(w).exists()):
                targets.append(w)
    return targets
