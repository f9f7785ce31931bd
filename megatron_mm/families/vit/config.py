"""The CLIP / SigLIP tower's config (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ...config import require


@dataclass
class VisionEncoderConfig:
    """A ViT: ``clip`` (class token, pre-norm ``ln_pre``, quick-GELU) or ``siglip``.

    ``feature_layer`` follows Hugging Face's ``vision_feature_layer``: index into the
    hidden states, where 0 is the embedding output and k the output of layer k; negative
    counts from the end (-1: last layer, -2: LLaVA-1.5's choice). Only the layers up to the
    feature layer are built, since later ones would never run.
    """

    model_type: str = "clip"
    hidden_size: int = 64
    num_layers: int = 2
    num_attention_heads: int = 4
    ffn_hidden_size: Optional[int] = None
    img_h: int = 28
    img_w: int = 28
    patch_dim: int = 7
    feature_layer: int = -1
    drop_class_token: bool = False  # --disable-vision-class-token drops it (LLaVA does)
    apply_post_layernorm: bool = False  # LLaVA-style models take pre-norm hidden states
    layernorm_epsilon: Optional[float] = None
    flag_prefix: str = "--vision-"

    def __post_init__(self):
        p = self.flag_prefix
        require(self.model_type in ("clip", "siglip"),
                 f"{p}model-type must be clip or siglip, got {self.model_type!r}")
        if self.ffn_hidden_size is None:
            self.ffn_hidden_size = 4 * self.hidden_size
        if self.layernorm_epsilon is None:
            self.layernorm_epsilon = 1e-5 if self.model_type == "clip" else 1e-6
        require(self.hidden_size % self.num_attention_heads == 0,
                 f"{p}hidden-size ({self.hidden_size}) must be divisible by "
                 f"{p}num-attention-heads ({self.num_attention_heads})")
        for name, size in (("--img-h", self.img_h), ("--img-w", self.img_w)):
            require(size % self.patch_dim == 0,
                     f"{name} ({size}) must be divisible by --patch-dim ({self.patch_dim})")
        require(1 <= self.num_layers_built <= self.num_layers,
                 f"{p}feature-layer {self.feature_layer} selects no transformer layer of "
                 f"{self.num_layers}; use a value in [1, {self.num_layers}] or "
                 f"[-{self.num_layers}, -1]")

    @property
    def has_class_token(self) -> bool:
        return self.model_type == "clip"

    @property
    def num_patches(self) -> int:
        return (self.img_h // self.patch_dim) * (self.img_w // self.patch_dim)

    @property
    def num_layers_built(self) -> int:
        k = self.feature_layer
        return k if k >= 0 else self.num_layers + 1 + k

    @property
    def num_output_tokens(self) -> int:
        """Tokens per image handed to the projector (the placeholder expansion count)."""
        keep_cls = self.has_class_token and not self.drop_class_token
        return self.num_patches + int(keep_cls)
