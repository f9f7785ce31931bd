"""InternVL (InternViT + pixel shuffle + LayerNorm/MLP projector) with dynamic tiling:
each image is cut into 1..``--max-num-tiles`` square tiles (plus a thumbnail), every tile
is one encoder item of ``--img-h`` pixels that hands the LLM ``tokens_per_tile`` tokens.

Shared flags keep their meaning (``--vision-hidden-size`` ..., ``--img-h`` the tile side,
``--patch-dim`` the patch); the family's own follow Megatron-LM's InternViT / NVLM names
where they exist (``--max-num-tiles``, ``--use-thumbnail``) and the same style otherwise.
"""

from __future__ import annotations

from ...config import ConfigError
from ...data.item_tags import IMAGE_TAGS
from ...plan.model import EncoderSpec, patch_embed_flops
from ..encoder import BuiltinData, EncoderFamily, encoder_transformer, fixed_feature_tokens
from .config import InternViTConfig
from .flags import InternVLFlags


def from_model_args(model) -> InternViTConfig:
    if model.img_w != model.img_h:
        raise ConfigError(f"internvit tiles are square: --img-w {model.img_w} must equal "
                          f"--img-h {model.img_h}")
    own = model.families[InternVLFlags]
    return InternViTConfig(
        hidden_size=model.vision_hidden_size,
        num_layers=model.vision_num_layers,
        num_attention_heads=model.vision_num_attention_heads,
        ffn_hidden_size=model.vision_ffn_hidden_size or 4 * model.vision_hidden_size,
        out_hidden_size=model.hidden_size,
        image_size=model.img_h, patch_size=model.patch_dim,
        norm_type=own.vision_norm_type,
        norm_epsilon=1e-6 if model.vision_norm_epsilon is None else model.vision_norm_epsilon,
        qk_norm=own.vision_qk_norm, attention_bias=own.vision_add_qkv_bias,
        final_layernorm=own.vision_final_layernorm,
        downsample_ratio=own.downsample_ratio,
        feature_layer=model.vision_feature_layer,
        layer_scale_init=own.vision_layerscale_init,
        min_tiles=own.min_num_tiles, max_tiles=own.max_num_tiles,
        use_thumbnail=own.use_thumbnail)


def planner_spec(name: str, enc: InternViTConfig, items_per_sample: int,
                 common: dict) -> EncoderSpec:
    """Items are tiles: ``items_per_sample`` tiles per sample, each of ``seq_length``
    ViT tokens and ``num_output_tokens`` LLM tokens. The projector's MLP input is the
    pixel-shuffled width (4 x hidden)."""
    h = enc.hidden_size
    return EncoderSpec(
        name=name, modality="vision",
        transformer=encoder_transformer(enc),
        tokens_per_item=enc.seq_length, llm_tokens_per_item=enc.num_output_tokens,
        items_per_sample=items_per_sample,
        embed_flops_per_token=patch_embed_flops(enc.patch_size, h, enc.in_channels),
        embed_params=(enc.patch_input_size + 1 + enc.num_positions + 1) * h,
        projector_input_size=enc.shuffled_size,
        **{**common, "projector_ffn_hidden_size": enc.out_hidden_size})


def fp8_token_counts(name: str, enc: InternViTConfig) -> dict:
    return {name: (enc.seq_length, "patches + 1 class token (--img-h, --patch-dim)"),
            f"{name}-projector": (enc.num_output_tokens,
                                  "tokens per tile (--img-h, --patch-dim, --downsample-ratio)")}


def check_sequence_parallel(name: str, enc: InternViTConfig, tp: int, impl: str) -> None:
    raise ConfigError(f"the {name} encoder (internvit) does not implement --sequence-parallel")


INTERNVIT = EncoderFamily(
    model_type="internvit", slot="vision", modality="image", config_class=InternViTConfig,
    from_model_args=from_model_args, planner_spec=planner_spec,
    build="megatron_mm.families.internvl.model:build_internvit",
    projector="megatron_mm.families.internvl.model:build_internvl_projector",
    media="megatron_mm.families.internvl.media:internvl_image_processor",
    feature_tokens=fixed_feature_tokens("image"), fp8_token_counts=fp8_token_counts,
    check_sequence_parallel=check_sequence_parallel, flags=InternVLFlags,
    checkpoint_flags=("vision_norm_type", "vision_qk_norm", "vision_add_qkv_bias",
                      "vision_final_layernorm", "downsample_ratio"),
    # the handwritten digits, each image one tile (its grid at any --max-num-tiles)
    builtin_data=BuiltinData("digits", "megatron_mm.data.digits:prepare_digits", ("image",)),
    # InternVLProcessor: <img> + tiles x tokens per tile <IMG_CONTEXT> + </img>
    item_tags={"image": IMAGE_TAGS["internvl"]})
