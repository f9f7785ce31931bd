"""The family's flags, as typed fields (their docstrings are the --help text)."""

import argparse
from dataclasses import dataclass

from ..flags import flag
from .config import NORM_TYPES


@dataclass(frozen=True)
class InternVLFlags:
    """InternViT's own flags (Megatron-LM's InternViT / NVLM names where they exist)."""

    vision_norm_type: str = flag("layer_norm", choices=sorted(NORM_TYPES))
    """internvit: the layers' norm (Hugging Face norm_type)"""
    vision_qk_norm: bool = False
    """internvit: RMSNorm of q and k over all heads (use_qk_norm)"""
    vision_add_qkv_bias: bool = False
    """internvit: biases on q / k / v (attention_bias)"""
    vision_final_layernorm: bool = False
    """internvit: the tower's LayerNorm after its last layer (use_mean_pooling=False)"""
    vision_layerscale_init: float = 0.1
    """internvit: initial layer scale of each branch when training from scratch
    (layer_scale_init_value)"""
    downsample_ratio: float = 0.5
    """internvit: pixel shuffle; 0.5 folds 2x2 patches into one token (Megatron-LM's
    --pixel-shuffle)"""
    max_num_tiles: int = 12
    """internvit: tiles an image is cut into at most (InternVL's max_patches; the thumbnail not
    counted)"""
    min_num_tiles: int = 1
    """internvit: tiles an image is cut into at least (min_patches)"""
    use_thumbnail: bool = flag(True, action=argparse.BooleanOptionalAction)
    """internvit: add the whole image resized to one tile after the tiles of an image cut into
    several"""
