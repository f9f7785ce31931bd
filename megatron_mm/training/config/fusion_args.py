"""Megatron-LM's ``--no-*-fusion`` flags, with its dests and meanings
(``megatron/training/arguments.py``): each fusion is on unless turned off, and runs where
its kernel exists (``models/fusions.py``). No torch import."""

from __future__ import annotations

from typing import Dict

FUSION_FLAGS = {  # dest -> flag
    "masked_softmax_fusion": "--no-masked-softmax-fusion",
    "bias_gelu_fusion": "--no-bias-gelu-fusion",
    "bias_swiglu_fusion": "--no-bias-swiglu-fusion",
    "bias_dropout_fusion": "--no-bias-dropout-fusion",
    "apply_rope_fusion": "--no-rope-fusion",
    "gradient_accumulation_fusion": "--no-gradient-accumulation-fusion",
}


def fusion_flags(fusion) -> Dict[str, bool]:
    """The flags' values (``fusion``: the RunConfig's fusion group)."""
    return {dest: getattr(fusion, dest) for dest in FUSION_FLAGS}
