"""Names a package exports but imports only when first used, so that importing the
package (and the command's start-up) stays quick."""

from __future__ import annotations

import importlib
import sys

TYPE_CHECKING = False  # the command imports this first: typing waits until it is needed
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``exports`` maps each name to the module
    that defines it (a name equal to a subpackage's maps to that subpackage itself); the
    value is kept in the package once imported."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        imported = importlib.import_module(module)
        value = imported if module == f"{package}.{name}" else getattr(imported, name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
