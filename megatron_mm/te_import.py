"""Whether Transformer Engine imports, asked before Megatron-Core is imported.

Megatron-Core (0.19.2) imports TE wherever it is installed and survives only a
``ModuleNotFoundError`` (``tensor_parallel/random.py``): then it runs without TE, and
``models/specs.py`` stops a run that asks for TE (or defaults to it) with TE's error. Any
other failure (a TE built against another torch: an undefined symbol; a missing CUDA
library) breaks ``import megatron.core`` itself, local layers included: ``check_importable``
says so first, with TE's error and the way out. Importing TE here costs nothing extra:
Megatron-Core would import it next.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from typing import Optional

INSTALL = ("pip install --no-build-isolation transformer_engine[pytorch,core_cuXX], "
           "XX the CUDA major of torch.version.cuda (docs/gpu.md)")


def transformer_engine_installed() -> bool:
    """TE is there to import (looked up, not imported)."""
    return importlib.util.find_spec("transformer_engine") is not None


@lru_cache(maxsize=None)
def import_exception() -> Optional[BaseException]:
    """What importing ``transformer_engine.pytorch`` raised (None: it imports, or TE is
    not installed)."""
    if not transformer_engine_installed():
        return None
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception as e:  # whatever TE raises is the user's to read
        return e
    return None


def import_error() -> Optional[str]:
    """None when TE imports; else why not, in TE's own words."""
    if not transformer_engine_installed():
        return "Transformer Engine is not installed (no module named 'transformer_engine')"
    e = import_exception()
    return None if e is None else f"{type(e).__name__}: {e}"


def check_importable() -> None:
    """Before ``import megatron.core``: a TE whose failure Megatron-Core does not survive
    stops the process here, saying what it is and what to do."""
    e = import_exception()
    if e is None or isinstance(e, ModuleNotFoundError):
        return
    raise ImportError(
        f"Transformer Engine is installed but does not import: {import_error()}. "
        "Megatron-Core imports it wherever it is installed, so neither --transformer-impl "
        f"can run: reinstall it into this torch ({INSTALL}), or uninstall it (pip "
        "uninstall transformer_engine transformer_engine_torch transformer_engine_cu12 "
        "transformer_engine_cu13) to train with --transformer-impl local") from e
