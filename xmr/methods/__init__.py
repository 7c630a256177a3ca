"""Method registry: one module per method, each registering a :class:`RetrievalModel` subclass.

Adding a method = one module here (discovered automatically) + one config file under ``config/methods``.
"""

from xmr.methods.base import METHODS, RetrievalModel
from xmr.registry import import_submodules

import_submodules("xmr.methods")

__all__ = ["METHODS", "RetrievalModel"]
