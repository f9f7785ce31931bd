"""Hugging Face checkpoints in and out: declarative weight tables (``tables.py``) with
named transforms (``transforms.py``), per-architecture config translation
(``families.py``), on-disk layouts (``layouts.py``) and the conversion itself
(``convert.py``). ``tools/convert_hf.py`` is the command line."""

from .errors import ConversionError
from .families import FAMILIES

__all__ = ["ConversionError", "FAMILIES"]
