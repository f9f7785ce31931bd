"""InternVL's vision-side config (InternViT, pixel shuffle, MLP projector) and its tiling
fields, torch-free: the encoder registry, the argument parser and the planner read it
before any process group exists (the Megatron-Core ``TransformerConfig``s are built in
``families/internvl/transformer_config.py``).

Field names follow the package's (``num_layers``, ``ffn_hidden_size``); ``from_hf`` reads
Hugging Face's ``InternVLConfig`` (its ``vision_config`` and the projector / feature
fields) and refuses what this encoder does not implement rather than dropping it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...config import ConfigError, require
from .tiles import InternVLTiling

NORM_TYPES = {"layer_norm": "LayerNorm", "rms_norm": "RMSNorm"}
ACTIVATIONS = ("gelu",)  # Hugging Face's ACT2FN["gelu"]: exact GELU (models/)
QK_NORM_EPSILON = 1e-6  # Hugging Face builds q_norm / k_norm with the RMSNorm's default eps
PROJECTOR_NORM_EPSILON = 1e-5  # ... and the projector's LayerNorm with nn.LayerNorm's


@dataclass
class InternViTConfig:
    """Defaults are InternVL3-1B's (InternViT-300M, Qwen2.5-0.5B). ``image_size`` is the
    tile side the position embeddings were trained for; ``feature_layer`` indexes
    Hugging Face's ``hidden_states`` (0 = embeddings, -1 = the tower's output);
    ``final_layernorm``: the tower's own LayerNorm after the last layer (Hugging Face
    ``use_mean_pooling=False``), used only when ``feature_layer`` is -1."""

    hidden_size: int = 1024
    num_layers: int = 24
    num_attention_heads: int = 16
    ffn_hidden_size: int = 4096
    out_hidden_size: int = 896  # the LLM's hidden size: the projector's output
    image_size: int = 448
    patch_size: int = 14
    in_channels: int = 3
    norm_type: str = "layer_norm"
    norm_epsilon: float = 1e-6
    qk_norm: bool = False
    attention_bias: bool = True
    hidden_act: str = "gelu"
    final_layernorm: bool = False
    downsample_ratio: float = 0.5
    projector_hidden_act: str = "gelu"
    feature_layer: int = -1
    # Initial value of the layer scale (ls1 / ls2) when training from scratch (Hugging
    # Face layer_scale_init_value; checkpoints bring their own).
    layer_scale_init: float = 0.1
    # Dynamic tiling (the media processor's; not the checkpoint's): Megatron-LM's
    # --max-num-tiles / --use-thumbnail, InternVL's min/max_patches.
    min_tiles: int = 1
    max_tiles: int = 12
    use_thumbnail: bool = True
    model_type: str = "internvit"
    flag_prefix: str = "--vision-"

    def __post_init__(self):
        p = self.flag_prefix
        require(self.hidden_size % self.num_attention_heads == 0,
                 f"{p}num-attention-heads {self.num_attention_heads} must divide "
                 f"{p}hidden-size {self.hidden_size}")
        require(self.norm_type in NORM_TYPES,
                 f"{p}norm-type {self.norm_type!r}: one of {sorted(NORM_TYPES)}")
        for name in ("hidden_act", "projector_hidden_act"):
            require(getattr(self, name) in ACTIVATIONS,
                     f"{name}={getattr(self, name)!r}: only {sorted(ACTIVATIONS)} is "
                     "implemented")
        require(self.image_size % self.patch_size == 0,
                 f"{p}image-size {self.image_size} must be a multiple of {p}patch-size "
                 f"{self.patch_size}")
        scale = 1 / self.downsample_ratio
        require(scale == round(scale) and scale >= 1,
                 f"downsample_ratio {self.downsample_ratio} must be 1 / an integer (pixel "
                 "shuffle folds scale x scale patches into one token)")
        require(self.patches_per_side % self.shuffle_scale == 0,
                 f"{p}image-size {self.image_size} gives {self.patches_per_side} patches "
                 f"a side, not a multiple of the pixel shuffle's {self.shuffle_scale}")
        require(-(self.num_layers + 1) <= self.feature_layer <= self.num_layers,
                 f"vision_feature_layer {self.feature_layer} is not an index into the "
                 f"{self.num_layers + 1} hidden states of a {self.num_layers}-layer tower")
        require(self.model_type == "internvit",
                 f"{p}model-type must be internvit, got {self.model_type!r}")
        self.tiling  # noqa: B018  (validates the tiling fields)
        require(self.layers_run >= 1,
                 f"vision_feature_layer {self.feature_layer} selects the patch embeddings: "
                 "at least one transformer layer must run")

    @property
    def tiling(self) -> InternVLTiling:
        """The tiling of images into tiles of ``image_size`` (``plan/internvl_tiles``)."""
        try:
            return InternVLTiling(tile_size=self.image_size, min_tiles=self.min_tiles,
                                  max_tiles=self.max_tiles, use_thumbnail=self.use_thumbnail,
                                  patch_size=self.patch_size,
                                  downsample_ratio=self.downsample_ratio)
        except ValueError as e:
            raise ConfigError(f"--min-num-tiles / --max-num-tiles: {e}") from None

    @property
    def num_output_tokens(self) -> int:
        """LLM tokens of one tile (an item of this encoder): 256 for 448 px, patch 14,
        ratio 0.5."""
        return (self.patches_per_side // self.shuffle_scale) ** 2

    @property
    def seq_length(self) -> int:
        """Tokens per tile through the ViT layers: the class token and the patches."""
        return self.num_positions

    @property
    def num_layers_built(self) -> int:
        return self.layers_run

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def patch_input_size(self) -> int:
        """Values per patch: channels x patch x patch (588 for 14 px RGB)."""
        return self.in_channels * self.patch_size ** 2

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_positions(self) -> int:
        """Position embeddings: the class token's, then one per patch of a trained tile."""
        return self.patches_per_side ** 2 + 1

    @property
    def shuffle_scale(self) -> int:
        return round(1 / self.downsample_ratio)

    @property
    def shuffled_size(self) -> int:
        """Width of one token after the pixel shuffle (the projector's input)."""
        return self.hidden_size * self.shuffle_scale ** 2

    @property
    def layers_run(self) -> int:
        """Transformer layers the selected features need (the rest are never run, so the
        Megatron model does not build them)."""
        return self.feature_layer % (self.num_layers + 1)

    @property
    def applies_final_layernorm(self) -> bool:
        return self.final_layernorm and self.feature_layer in (-1, self.num_layers)

    @classmethod
    def from_hf(cls, hf) -> "InternViTConfig":
        """From Hugging Face's ``InternVLConfig`` (the full model's: the projector and the
        feature selection live there); a setting this encoder does not implement is an
        error naming the field."""
        v = hf.vision_config
        refuse = {
            "vision_feature_select_strategy":
                (hf.vision_feature_select_strategy != "default",
                 "only 'default' (drop the class token) is implemented; Hugging Face's "
                 "pixel shuffle cannot take the class token either"),
            "vision_feature_layer": (not isinstance(hf.vision_feature_layer, int),
                                     "a list of layers is not implemented"),
            "vision_config.use_mask_token": (v.use_mask_token, "masked image modelling "
                                             "is not implemented"),
            "vision_config.use_absolute_position_embeddings":
                (not v.use_absolute_position_embeddings, "only absolute position "
                 "embeddings are implemented"),
        }
        for field, (bad, why) in refuse.items():
            if bad:
                raise ConfigError(f"InternVL config {field}={_value(hf, field)!r}: {why}")
        image, patch = tuple(v.image_size), tuple(v.patch_size)
        for field, (a, b) in (("image_size", image), ("patch_size", patch)):
            if a != b:
                raise ConfigError(f"InternVL config vision_config.{field}={list(image)}: "
                                  "only square sizes are implemented")
        return cls(hidden_size=v.hidden_size, num_layers=v.num_hidden_layers,
                   num_attention_heads=v.num_attention_heads,
                   ffn_hidden_size=v.intermediate_size,
                   out_hidden_size=hf.text_config.hidden_size, image_size=image[0],
                   patch_size=patch[0], in_channels=v.num_channels, norm_type=v.norm_type,
                   norm_epsilon=v.layer_norm_eps, qk_norm=v.use_qk_norm,
                   attention_bias=v.attention_bias, hidden_act=v.hidden_act,
                   final_layernorm=not v.use_mean_pooling,
                   downsample_ratio=hf.downsample_ratio,
                   projector_hidden_act=hf.projector_hidden_act,
                   feature_layer=hf.vision_feature_layer,
                   layer_scale_init=v.layer_scale_init_value)


def _value(hf, field):
    obj = hf
    for part in field.split("."):
        obj = getattr(obj, part)
    return obj
