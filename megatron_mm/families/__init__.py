"""Model families, one folder each (``vit``, ``whisper``, ``internvl``, ``qwen2_5_vl``,
the LLMs), and the registry that serves training, planning and conversion."""

from .encoder import SLOTS, BuiltinData, EncoderFamily, resolve
from .record import Family
from .registry import (ARCHITECTURES, EXTRA_ENV, FAMILIES, MODEL_FAMILIES, TEXT_MODELS,
                       architecture, builtin_data_for, family, family_of, modalities_of,
                       modality_of, slot_choices, slot_families, text_model)

__all__ = ["ARCHITECTURES", "BuiltinData", "EXTRA_ENV", "EncoderFamily", "FAMILIES", "Family",
           "MODEL_FAMILIES", "SLOTS", "TEXT_MODELS", "architecture", "builtin_data_for",
           "family", "family_of", "modalities_of", "modality_of", "resolve", "slot_choices",
           "slot_families", "text_model"]
