"""Method registry: one module per method, each registering a :class:`RetrievalModel` subclass.

Adding a method = one module here (discovered automatically) + one config file under ``config/methods``; or,
outside the package, one module named in ``$XMR_PLUGINS`` (:func:`xmr.core.registry.import_plugins`) + one recipe.
"""

from xmr.core.registry import import_plugins, import_submodules
from xmr.methods.base import METHODS, RetrievalModel

import_submodules("xmr.methods")
import_plugins()

__all__ = ["METHODS", "RetrievalModel"]
