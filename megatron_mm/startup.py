"""What a process does before it imports Megatron-Core: the first call of every entry point
(scripts, tools, spawned workers), never a side effect of importing the packages that need
it (``prepared.py`` is the call as an import, for fork-server preload lists only).

``prepare_megatron_core()`` checks that Transformer Engine imports (``te_import.py``: a
broken TE breaks ``import megatron.core`` itself), silences Megatron-Core's import warnings
that say nothing here (``quiet.py``), then applies the CPU patches, each where its upstream
bug bites (``patches/registry.py``); all three must precede the first ``megatron.core``
import. The packages that import Megatron-Core (``models``, ``training``, ``runtime``) call
``require_prepared`` first, so a forgotten call is this error, not Megatron-Core's failure
far from its cause.
"""

_prepared = False


def prepare_megatron_core() -> list[str]:
    """Once per process, before any ``megatron.core`` import; returns the patches applied."""
    from megatron_mm import te_import
    from megatron_mm.runtime_patches import apply_cpu_patches, applied_patches
    from megatron_mm.quiet import silence_expected_warnings

    global _prepared
    if not _prepared:
        te_import.check_importable()
        silence_expected_warnings()
        apply_cpu_patches()
        _prepared = True
    return applied_patches()


def spawned(rank: int, target: str, *args):
    """A spawned process's entry (``torch.multiprocessing.start_processes``' ``fn``):
    prepares, then calls ``target`` ("module:function") with ``rank, *args``. A spawned
    process imports its ``fn``'s module before running it, so ``fn`` must live here,
    not in a module that imports Megatron-Core."""
    import importlib

    prepare_megatron_core()
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)(rank, *args)


def require_prepared(user: str) -> None:
    if not _prepared:
        raise RuntimeError(
            f"{user} imports Megatron-Core: call megatron_mm.startup.prepare_megatron_core() "
            "first in the entry point, before any megatron.core import (it checks Transformer "
            "Engine and applies the CPU patches; examples/pretrain_mllm.py shows where)")
