"""Probe layer: load generation against real OpenAI-compatible servers, and run files.

``capsim.probe`` is both this package and the API function ``capsim.api.probe``: calling
the package calls the function, so ``from capsim import probe; probe(url=..., ...)`` works
whether or not this package was imported first (Python binds a subpackage to its parent's
attribute of the same name on import).
"""

import sys
import types


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        from capsim.api import probe

        return probe(*args, **kwargs)

    __call__.__doc__ = "Run capsim.api.probe (see its docstring)."


sys.modules[__name__].__class__ = _CallableModule
