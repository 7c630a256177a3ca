"""Small name -> object registries (methods, similarities, re-rankers, backbones, datasets, ...)."""

from __future__ import annotations

from typing import Any, Callable, Generic, Iterator, TypeVar

from xmr.errors import XmrError

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


def import_submodules(package: str) -> None:
    """Import every module of ``package`` so that their ``@REGISTRY.register`` decorators run."""
    import importlib
    import pkgutil

    pkg = importlib.import_module(package)
    for info in pkgutil.iter_modules(pkg.__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{package}.{info.name}")
