"""The registry of model families: adding one is its folder plus one line in ``BUILTIN``
(or, outside the package, its module named in ``$MEGATRON_MM_FAMILIES``).

Each line names a module whose ``FAMILY`` is a ``record.Family``. The registry serves
training (encoder model types and slots), planning (``EncoderFamily.planner_spec``) and
conversion (Hugging Face architectures); it is read once per process, and worker
processes inherit the environment variable, so a family registered there reaches them.
"""

from __future__ import annotations

import importlib
import os
from typing import Dict, List, Optional, Tuple

from ..config import ConfigError
from .encoder import BuiltinData, EncoderFamily
from .record import Family

# One line per family, in the order their choices are listed (flags, supported models).
BUILTIN = (
    "megatron_mm.families.llama",
    "megatron_mm.families.mistral",
    "megatron_mm.families.qwen2",
    "megatron_mm.families.qwen3",
    "megatron_mm.families.qwen3_moe",
    "megatron_mm.families.vit",
    "megatron_mm.families.whisper",
    "megatron_mm.families.internvl",
    "megatron_mm.families.qwen2_5_vl",
    "megatron_mm.families.qwen3_vl",
    "megatron_mm.families.qwen3_vl_moe",
    "megatron_mm.families.qwen3_5",
    "megatron_mm.families.qwen3_5_moe",
)
# Comma-separated modules of further families (each with a ``FAMILY``), importable from
# ``sys.path`` (``PYTHONPATH``).
EXTRA_ENV = "MEGATRON_MM_FAMILIES"


def _load() -> Tuple[Family, ...]:
    extra = [m.strip() for m in os.environ.get(EXTRA_ENV, "").split(",") if m.strip()]
    out = []
    for module in (*BUILTIN, *extra):
        try:
            out.append(importlib.import_module(module).FAMILY)
        except (ImportError, AttributeError) as e:
            raise ConfigError(f"family module {module!r} ({EXTRA_ENV}): {e}") from None
    return tuple(out)


MODEL_FAMILIES: Tuple[Family, ...] = _load()
FAMILIES: Dict[str, EncoderFamily] = {
    e.model_type: e for f in MODEL_FAMILIES for e in f.encoders}
# Hugging Face architecture / text model type -> its family's conversion module.
ARCHITECTURES: Dict[str, str] = {
    a: f.conversion for f in MODEL_FAMILIES for a in f.architectures}
TEXT_MODELS: Dict[str, str] = {
    t: f.conversion for f in MODEL_FAMILIES for t in f.text_models}


def family(model_type: str) -> EncoderFamily:
    try:
        return FAMILIES[model_type]
    except KeyError:
        raise ConfigError(f"unknown encoder model type {model_type!r}; registered: "
                          f"{', '.join(sorted(FAMILIES))}") from None


def architecture(name: str):
    """The ``hf.families.Family`` converting Hugging Face architecture ``name`` (its
    family's conversion module imported now); KeyError: none converts it."""
    return importlib.import_module(ARCHITECTURES[name]).ARCHITECTURES[name]


def text_model(model_type: str):
    """The ``hf.families.TextModel`` of a Hugging Face text config's ``model_type``
    (imported now); KeyError: no family converts it."""
    return importlib.import_module(TEXT_MODELS[model_type]).TEXT_MODELS[model_type]


def family_of(config) -> EncoderFamily:
    """The family of an encoder config (its ``model_type``)."""
    return family(config.model_type)


def slot_families(slot: str) -> List[EncoderFamily]:
    return [f for f in FAMILIES.values() if f.slot == slot]


def slot_choices(slot: str) -> List[str]:
    """``--{slot}-model-type`` values: the registered families of the slot, and none."""
    return sorted(f.model_type for f in slot_families(slot)) + ["none"]


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
