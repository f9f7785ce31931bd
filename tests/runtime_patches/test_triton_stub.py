"""Patch ``triton_stub``: ``import megatron.core`` without triton installed."""

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

from megatron_mm.runtime_patches.triton_stub import TARGET

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is not None,
                                reason="triton is installed: the stub is not used")


def test_upstream_import_fails_without_triton(upstream):
    upstream.raised("import_megatron_core", "ModuleNotFoundError", "No module named 'triton'",
                    where=("paged_stash.py", "import triton"))


def _upstream_module_constants():
    """``__all__`` and ``GLOBAL_BLOCK_SIZE`` of the real module, read from its source."""
    import megatron.core

    source = Path(megatron.core.__file__).parent / "transformer/moe/ops/paged_stash.py"
    found = {}
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in ("__all__", "GLOBAL_BLOCK_SIZE"):
                found[node.targets[0].id] = ast.literal_eval(node.value)
    return found


def test_megatron_core_imports_with_the_stub():
    import megatron.core  # noqa: F401
    from megatron.core.pipeline_parallel import schedules  # the importer named in the notes
    from megatron.core.transformer.moe import paged_stash

    stub = sys.modules[TARGET]
    assert getattr(stub, "__megatron_mm_stub__", False)
    assert schedules.paged_stash_reset is paged_stash.paged_stash_reset
    # Only that one module is replaced: no fake ``triton`` that would flip HAVE_TRITON checks.
    assert "triton" not in sys.modules

    upstream = _upstream_module_constants()
    assert set(upstream["__all__"]) <= set(vars(stub)), "the stub must export what upstream does"
    assert stub.GLOBAL_BLOCK_SIZE == upstream["GLOBAL_BLOCK_SIZE"]
    for kernel in ("paged_stash_copy_kernel", "paged_stash_pop_kernel"):
        with pytest.raises(RuntimeError, match="triton"):
            getattr(stub, kernel)()
