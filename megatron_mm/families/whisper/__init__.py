"""Whisper: the audio encoder (Qwen2-Audio's, pooled by 2); Qwen2-Audio converts through
it."""

from ..record import Family
from .encoder import WHISPER

FAMILY = Family("whisper", encoders=(WHISPER,),
                architectures=("Qwen2AudioForConditionalGeneration",),
                conversion="megatron_mm.families.whisper.hf")
