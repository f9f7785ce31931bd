"""Qwen2.5-VL: the native-resolution vision encoder (images and video), its patch
merger and the M-RoPE positions of its LLM."""

from ..record import Family
from .encoder import QWEN2_5_VL

FAMILY = Family("qwen2_5_vl", encoders=(QWEN2_5_VL,),
                architectures=("Qwen2_5_VLForConditionalGeneration",),
                text_models=("qwen2_vl_text", "qwen2_5_vl_text"),
                conversion="megatron_mm.families.qwen2_5_vl.hf")
