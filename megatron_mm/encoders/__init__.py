"""Encoder families (CLIP, SigLIP, Whisper, ...) and their registry."""

from .family import SLOTS, EncoderFamily, resolve
from .registry import FAMILIES, family, family_of, modalities_of, modality_of, slot_families

__all__ = ["EncoderFamily", "FAMILIES", "SLOTS", "family", "family_of", "modalities_of",
           "modality_of", "resolve", "slot_families"]
