"""Skip ``megatron.core.datasets.utils.compile_helpers`` where the wheel's compiled helpers
import (megatron-core 0.19.2).

Megatron-LM's ``initialize_megatron`` (``_compile_dependencies``) runs ``make`` in the
installed ``megatron/core/datasets`` folder, which the wheel ships without its Makefile
but with ``helpers_cpp`` already compiled: ``make`` fails and rank 0 exits ("Failed to
compile the C++ dataset helper functions"). Where ``helpers_cpp`` imports there is
nothing to compile; otherwise the upstream build runs as before.
"""

import importlib

from .after_import import after_import


def _patch(module) -> None:
    compile_helpers = module.compile_helpers

    def compile_unless_prebuilt():
        try:
            importlib.import_module("megatron.core.datasets.helpers_cpp")
        except ImportError:
            compile_helpers()

    compile_unless_prebuilt.__doc__ = compile_helpers.__doc__
    module.compile_helpers = compile_unless_prebuilt


def apply() -> None:
    after_import("megatron.core.datasets.utils", _patch)
