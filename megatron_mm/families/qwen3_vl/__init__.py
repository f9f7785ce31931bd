"""Qwen3-VL: the native-resolution vision encoder (images and video) with DeepStack, its
patch mergers and the interleaved M-RoPE positions of its LLM (a Qwen3 decoder)."""

from ..record import Family
from .encoder import QWEN3_VL

FAMILY = Family("qwen3_vl", encoders=(QWEN3_VL,),
                architectures=("Qwen3VLForConditionalGeneration",),
                text_models=("qwen3_vl_text",),
                conversion="megatron_mm.families.qwen3_vl.hf")
