"""Names a package re-exports but imports only on first use (PEP 562 module ``__getattr__``).

The facade and the rooms whose modules are heavy or optional (``serving`` needs the ``serve``
extra) list their public names in ``__all__`` and resolve them here, so that importing the
package costs nothing until a name is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["lazy_getattr"]


def lazy_getattr(
    package: str, names: Sequence[str], modules: Sequence[str]
) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that imports each of ``names`` on first use.

    Args:
        package: the package's name (``"ferry.serving"``).
        names: the names it resolves (its ``__all__``, less what it defines itself).
        modules: where to look, in order (absolute, or relative to ``package`` when they start
            with ``_``): a name is taken from the first module whose ``__all__`` lists it, and
            only the modules up to that one are imported.
    """
    known = frozenset(names)
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        if name in known:
            for module in modules:
                found = importlib.import_module(
                    f"{package}.{module}" if module.startswith("_") else module
                )
                if name in getattr(found, "__all__", ()):
                    value = getattr(found, name)
                    namespace[name] = value  # later look-ups skip this function
                    return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
