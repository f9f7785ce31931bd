"""Encoder families (CLIP, SigLIP, Whisper, ...) and their registry."""

from .family import SLOTS, BuiltinData, EncoderFamily, resolve
from .registry import (FAMILIES, builtin_data_for, family, family_of, modalities_of,
                       modality_of, slot_families)

__all__ = ["BuiltinData", "EncoderFamily", "FAMILIES", "SLOTS", "builtin_data_for", "family",
           "family_of", "modalities_of", "modality_of", "resolve", "slot_families"]
