"""The registry of encoder families: adding a family is its module plus one line here."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from ..config import ConfigError
from .family import BuiltinData, EncoderFamily
from .internvl import INTERNVIT
from .qwen2_5_vl import QWEN2_5_VL
from .vit import CLIP, SIGLIP
from .whisper import WHISPER

FAMILIES: Dict[str, EncoderFamily] = {f.model_type: f for f in (
    CLIP,
    SIGLIP,
    WHISPER,
    INTERNVIT,
    QWEN2_5_VL,
)}


def family(model_type: str) -> EncoderFamily:
    try:
        return FAMILIES[model_type]
    except KeyError:
        raise ConfigError(f"unknown encoder model type {model_type!r}; registered: "
                          f"{', '.join(sorted(FAMILIES))}") from None


def family_of(config) -> EncoderFamily:
    """The family of an encoder config (its ``model_type``)."""
    return family(config.model_type)


def slot_families(slot: str) -> List[EncoderFamily]:
    return [f for f in FAMILIES.values() if f.slot == slot]


def modality_of(config) -> str:
    """The media key an encoder config reads (its first, for families reading several)."""
    return family_of(config).modality


def modalities_of(config) -> Tuple[str, ...]:
    """Every media key an encoder config reads (``EncoderFamily.modalities``)."""
    return family_of(config).modalities


def builtin_data_for(configs) -> Optional[BuiltinData]:
    """The built-in data a model of these encoder configs trains on without --data-path:
    the first family's (in encoder order) whose records hold every modality the model
    reads (CLIP + Whisper: Whisper's handwritten + spoken digits); None: no such data."""
    needed = {m for c in configs for m in modalities_of(c)}
    for c in configs:
        data = family_of(c).builtin_data
        if data is not None and needed <= set(data.modalities):
            return data
    return None
