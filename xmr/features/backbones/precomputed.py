"""``name: precomputed``: features the authors computed and released (VSE++'s ``*_precomp`` vectors). There is no
extractor; ``xmr import-features`` (the entry's ``import_command``) builds the feature files instead."""

from __future__ import annotations

from xmr.errors import XmrError
from xmr.features.backbones import BACKBONES, Backbone


@BACKBONES.register("precomputed")
class PrecomputedOnly(Backbone):
    name = "precomputed"

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        how = cfg.get("import_command") or "xmr import-features (docs/datasets.md)"
        raise XmrError(f"backbone {cfg.get('key', 'precomputed')}: these features were precomputed by the authors "
                       f"and cannot be extracted here; import them: {how}")
