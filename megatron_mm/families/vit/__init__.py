"""CLIP and SigLIP: one ViT (``model.py``), one config, one media processor and one
weight table, the two differing only in their values; LLaVA-1.5 and LLaVA-OneVision convert
through them."""

from ..record import Family
from .encoder import CLIP, SIGLIP

FAMILY = Family("vit", encoders=(CLIP, SIGLIP),
                architectures=("LlavaForConditionalGeneration",
                               "LlavaOnevisionForConditionalGeneration"),
                conversion="megatron_mm.families.vit.hf")
