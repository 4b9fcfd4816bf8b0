"""Names a package exports, imported on first use: a program that asks the command line for
``--help``, or imports one light module of a package (a config), loads none of SQLAlchemy,
Redis or RQ through the package's ``__init__``."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, homes: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose name ``homes`` maps each
    exported name to the module it lives in; ``namespace`` (the package's ``globals()``)
    keeps each name once imported."""

    def getattr_(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted([*namespace, *homes])

    return getattr_, dir_
