"""Small name -> object registries (methods, similarities, re-rankers, backbones, datasets, ...)."""

from __future__ import annotations

from typing import Any, Callable, Generic, Iterator, TypeVar

from xmr.core.errors import XmrError

T = TypeVar("T")


class Registry(Generic[T]):
    """A named table of entries; ``@REG.register("name")`` adds one, ``REG.get("name")`` looks it up."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._entries[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise XmrError(
                f"unknown {self.kind} {name!r}; choose one of: {', '.join(sorted(self._entries))}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))

    def items(self) -> list[tuple[str, Any]]:
        return sorted(self._entries.items())


class RegistryNames:
    """The names of the registry ``attr`` of ``module``, for argparse's ``choices=``: the module is imported only
    when a value is checked or the names are printed, so building the ``xmr`` parser (every command's start-up)
    does not import what the registry's entries import (torch, for the checkpoint formats)."""

    def __init__(self, module: str, attr: str) -> None:
        self.module, self.attr = module, attr

    def _registry(self) -> Registry:
        import importlib

        return getattr(importlib.import_module(self.module), self.attr)

    def __contains__(self, name: object) -> bool:
        return name in self._registry()

    def __iter__(self) -> Iterator[str]:
        return iter(self._registry())


def import_submodules(package: str) -> None:
    """Import every module of ``package`` so that their ``@REGISTRY.register`` decorators run."""
    import importlib
    import pkgutil

    pkg = importlib.import_module(package)
    for info in pkgutil.iter_modules(pkg.__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{package}.{info.name}")


PLUGINS_ENV = "XMR_PLUGINS"


def import_plugins() -> list[str]:
    """Import the extra modules named in ``$XMR_PLUGINS`` (comma-separated module names or paths to ``.py``
    files), so that methods, re-rankers, ... written outside the package register themselves like the built-in
    ones (timm-style registries). Called when the method and re-ranker registries load; importing twice is a no-op.
    Returns the module names."""
    import importlib
    import importlib.util
    import os
    import sys
    from pathlib import Path

    names = []
    for item in filter(None, (s.strip() for s in os.environ.get(PLUGINS_ENV, "").split(","))):
        if item.endswith(".py"):
            path = Path(item).resolve()
            name = f"xmr_plugin_{path.stem}"
            if name not in sys.modules:
                if not path.exists():
                    raise XmrError(f"${PLUGINS_ENV}: {item}: file not found")
                spec = importlib.util.spec_from_file_location(name, path)
                module = importlib.util.module_from_spec(spec)
                sys.modules[name] = module  # before exec: a plugin may import the registries that import it
                try:
                    spec.loader.exec_module(module)
                except BaseException:
                    del sys.modules[name]
                    raise
        else:
            name = item
            try:
                importlib.import_module(name)
            except ModuleNotFoundError as e:
                raise XmrError(f"${PLUGINS_ENV}: cannot import {item!r} ({e}); check the name and PYTHONPATH") from None
        names.append(name)
    return names
