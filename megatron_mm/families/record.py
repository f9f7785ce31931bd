"""What one model family declares to the registry: its encoders (training and planning)
and the Hugging Face architectures it converts.

Torch-free, like ``encoder.py``: the conversion side is named as a module and imported on
first use, so the planner and the argument parser never load it.
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
    - ``text_models``: the ``model_type`` of each Hugging Face text config whose decoder
      it converts (an LLM family's, or a multimodal one's own LLM variant).
    - ``conversion``: the module holding ``ARCHITECTURES`` ({architecture:
      ``hf.families.Family``}: weight table, config-field rules, flags) and
      ``TEXT_MODELS`` ({model_type: ``hf.families.TextModel``}); None: it converts nothing.
    """

    name: str
    encoders: Tuple[EncoderFamily, ...] = ()
    architectures: Tuple[str, ...] = ()
    text_models: Tuple[str, ...] = ()
    conversion: str | None = None

    def __post_init__(self):
        if bool(self.architectures or self.text_models) != (self.conversion is not None):
            raise ValueError(f"family {self.name!r}: a conversion module goes with its "
                             "architectures and text models")
