"""Method registry: one module per method, each registering a :class:`RetrievalModel` subclass.

Adding a method = one module here (imported below) + one config file under ``config/methods``.
"""

from xmr.methods.base import METHODS, RetrievalModel

# Each import registers its method(s).
from xmr.methods import vsepp  # noqa: E402,F401

__all__ = ["METHODS", "RetrievalModel"]
