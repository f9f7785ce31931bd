"""Hugging Face checkpoints in and out: declarative weight tables (``tables.py`` and each
family's ``hf_table.py``) with named transforms (``transforms.py``), the architecture
record and lookup (``families.py``; each family declares its own in its ``hf.py``),
on-disk layouts (``layouts.py``) and the conversion itself (``convert.py``).
``tools/convert_hf.py`` is the command line."""

from ..families import ARCHITECTURES
from .errors import ConversionError

__all__ = ["ARCHITECTURES", "ConversionError"]
