"""Run a patch when a module is first imported, not before: Megatron-LM's training loop
(``megatron.training``, shipped in the megatron-core wheel) is heavy to import and most
processes never use it, so its patches wait for its import instead of forcing it."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Callable, Dict, List

_hooks: Dict[str, List[Callable]] = {}


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _hooks:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_patch(module):
            exec_module(module)
            for hook in _hooks.pop(name, ()):
                hook(module)

        spec.loader.exec_module = exec_then_patch
        return spec


_FINDER = _Finder()


def after_import(name: str, hook: Callable) -> None:
    """``hook(module)`` once module ``name`` is imported (now, if it already is)."""
    if name in sys.modules:
        hook(sys.modules[name])
        return
    _hooks.setdefault(name, []).append(hook)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
