"""InternVL: InternViT with dynamic tiling, pixel shuffle and its projector."""

from ..record import Family
from .encoder import INTERNVIT

FAMILY = Family("internvl", encoders=(INTERNVIT,),
                architectures=("InternVLForConditionalGeneration",),
                conversion="megatron_mm.families.internvl.hf")
