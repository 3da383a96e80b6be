"""Calls a function once a named module has been imported.

For registering flagos with a framework that torch_fl must not import itself
(importing Lightning from ``import torch_fl`` would cost seconds, and under
PyTorch's device-backend autoload torch_fl is imported *while* the framework
is importing torch, before the framework's modules exist).

:func:`when_imported` runs the function now if the module is already
imported, otherwise right after the module's body has run, at its first
import. The function's failure is a warning, never a failed import of the
framework.
"""
from __future__ import annotations

import importlib.abc
import sys
import warnings
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

Callback = Callable[[ModuleType], None]

# Module name -> the functions to call once it is imported. Only touched
# under the import lock (imports and this module's own import).
_pending: dict[str, list[Callback]] = {}


def when_imported(name: str, callback: Callback) -> None:
    """Calls ``callback(module)`` once module ``name`` is imported."""
    module = sys.modules.get(name)
    if module is not None and getattr(module, "__spec__", None) is not None \
            and not getattr(module.__spec__, "_initializing", False):
        _call(name, callback, module)
        return
    _pending.setdefault(name, []).append(callback)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def _call(name: str, callback: Callback, module: ModuleType) -> None:
    try:
        callback(module)
    except Exception as e:  # noqa: BLE001  (a framework's import must not fail here)
        warnings.warn(f"torch_fl: registering flagos with {name} failed ({type(e).__name__}: "
                      f"{e}); pass the flagos classes explicitly (docs/usage.md, \"Frameworks\")",
                      RuntimeWarning, stacklevel=2)


class _CallAfterExec(importlib.abc.Loader):
    """Runs the module's own loader, then the functions waiting for it."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # The module keeps its own loader (source, resources, reloads).
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        for callback in _pending.pop(module.__name__, []):
            _call(module.__name__, callback, module)
        if not _pending and _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)


class _WaitingModulesFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: asks the finders after it for a module someone
    waits for and wraps its loader in :class:`_CallAfterExec`."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _CallAfterExec(spec.loader)
        return spec


_FINDER = _WaitingModulesFinder()
