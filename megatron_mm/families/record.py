"""What one model family declares to the registry: its encoders (training and planning)
and the Hugging Face architectures it converts.

Torch-free, like ``encoder.py``: the conversion side is named as ``"package.module:attr"``
and imported on first use, so the planner and the argument parser never load it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from .encoder import EncoderFamily


@dataclass(frozen=True)
class Family:
    """One model family (a folder under ``megatron_mm/families/``).

    - ``name``: the folder's name.
    - ``encoders``: its ``EncoderFamily`` records (CLIP and SigLIP share one folder).
    - ``architectures``: the Hugging Face ``architectures`` names it converts.
    - ``conversion``: ``"package.module:attr"`` naming {architecture: ``hf.families.Family``}
      (its weight table, config-field rules and flags); None: it converts nothing.
    """

    name: str
    encoders: Tuple[EncoderFamily, ...] = ()
    architectures: Tuple[str, ...] = ()
    conversion: str | None = None

    def __post_init__(self):
        if bool(self.architectures) != (self.conversion is not None):
            raise ValueError(f"family {self.name!r}: architectures and conversion go together")
