"""``name: precomputed``: features the authors computed and released (VSE++'s ``*_precomp`` vectors). There is no
extractor; ``xmr import-features`` (the entry's ``import_command``) builds the feature files instead (rule
``import_precomputed``)."""

from __future__ import annotations

import shlex

from xmr.core.errors import XmrError
from xmr.features.backbones import BACKBONES, Backbone


def import_argv(cfg: dict, dataset: str, split: str, out: str | None = None) -> list[str]:
    """The entry's ``import_command`` for one dataset split, as ``xmr`` arguments (``import-features ...``), its
    ``--out`` replaced by ``out`` when given (the run's feature folder may not be features/)."""
    key = cfg.get("key", "precomputed")
    command = cfg.get("import_command")
    if not command:
        raise XmrError(f"config/backbones.yaml {key}: precomputed features need an import_command "
                       f"(the xmr import-features line that builds features/{{dataset}}/{key}/{{split}}.h5)")
    argv = shlex.split(command.format(dataset=dataset, split=split))
    if argv[:2] != ["xmr", "import-features"]:
        raise XmrError(f"config/backbones.yaml {key}: import_command must start with 'xmr import-features', "
                       f"not {' '.join(argv[:2])!r}")
    argv = argv[1:]
    if out is not None:
        if "--out" in argv:
            argv[argv.index("--out") + 1] = str(out)
        else:
            argv += ["--out", str(out)]
    return argv


def import_source(cfg: dict, dataset: str, split: str) -> str | None:
    """The ``--src`` folder of the entry's import command for ``dataset``/``split`` (None: the command names none)."""
    argv = import_argv(cfg, dataset, split)
    return argv[argv.index("--src") + 1] if "--src" in argv[:-1] else None


def not_extractable(cfg: dict, dataset: str = "{dataset}", split: str = "{split}", out: str | None = None
                    ) -> XmrError:
    """The one-line refusal of ``xmr extract`` for a precomputed-only entry, naming the command that imports it
    (writing ``out`` when given)."""
    how = (f"xmr {shlex.join(import_argv(cfg, dataset, split, out))}" if cfg.get("import_command")
           else "xmr import-features (docs/datasets.md)")
    return XmrError(f"backbone {cfg.get('key', 'precomputed')}: these features were precomputed by the authors "
                    f"and cannot be extracted here; import them: {how}")


@BACKBONES.register("precomputed")
class PrecomputedOnly(Backbone):
    name = "precomputed"

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        raise not_extractable(cfg)
