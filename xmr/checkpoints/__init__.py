"""Official checkpoints of the reference implementations: one module per format, each registering a
:class:`~xmr.checkpoints.base.CheckpointFormat` (discovered automatically)."""

from xmr.checkpoints.base import CHECKPOINT_FORMATS, CheckpointFormat, ImportedModel
from xmr.core.registry import import_submodules

import_submodules("xmr.checkpoints")

__all__ = ["CHECKPOINT_FORMATS", "CheckpointFormat", "ImportedModel"]
