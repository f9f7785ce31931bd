"""The CLIP and SigLIP ViTs (LLaVA-1.5, OneVision): fixed-size square images, one
``VisionEncoderConfig`` and one module (``families/vit/model.py``) for both."""

from __future__ import annotations

import dataclasses

from ...plan.fp8 import encoder_sequence_multiple
from ...plan.model import EncoderSpec, patch_embed_flops
from ..encoder import BuiltinData, EncoderFamily, encoder_transformer, fixed_feature_tokens
from .config import VisionEncoderConfig


def from_model_args(model) -> VisionEncoderConfig:
    return VisionEncoderConfig(
        model_type=model.vision_model_type,
        hidden_size=model.vision_hidden_size,
        num_layers=model.vision_num_layers,
        num_attention_heads=model.vision_num_attention_heads,
        ffn_hidden_size=model.vision_ffn_hidden_size,
        img_h=model.img_h, img_w=model.img_w, patch_dim=model.patch_dim,
        feature_layer=model.vision_feature_layer,
        drop_class_token=model.disable_vision_class_token,
        layernorm_epsilon=model.vision_norm_epsilon,
    )


def planner_spec(name: str, enc: VisionEncoderConfig, items_per_sample: int,
                 common: dict) -> EncoderSpec:
    tokens = enc.num_patches + int(enc.has_class_token)
    return EncoderSpec(
        name=name, modality="vision",
        transformer=encoder_transformer(enc),
        tokens_per_item=tokens, llm_tokens_per_item=enc.num_output_tokens,
        items_per_sample=items_per_sample,
        embed_flops_per_token=patch_embed_flops(enc.patch_dim, enc.hidden_size),
        embed_params=(3 * enc.patch_dim ** 2 + tokens + 1) * enc.hidden_size,
        **common)


def fp8_token_counts(name: str, enc: VisionEncoderConfig) -> dict:
    cls = "+ 1 class token " if enc.has_class_token else ""
    return {name: (enc.num_patches + int(enc.has_class_token),
                   f"patches {cls}(--img-h, --img-w, --patch-dim)"),
            f"{name}-projector": (enc.num_output_tokens,
                                  "tokens per image (--img-h, --img-w, --patch-dim, "
                                  "--disable-vision-class-token)")}


def fp8_shard_token_counts(name: str, enc: VisionEncoderConfig, tp: int, recipe: str) -> dict:
    """Under --sequence-parallel the layers and the projector run on each rank's shard of
    the patches, class token and padding (``sequence_parallel.project_shard``); the ViT
    pads them to TP x the FP8 alignment (``plan.fp8.encoder_sequence_multiple``)."""
    t = enc.num_patches + int(enc.has_class_token)
    t += -t % encoder_sequence_multiple(recipe, tp, True)
    source = f"patches, class token and padding over --tensor-model-parallel-size {tp}"
    return {name: (t // tp, source), f"{name}-projector": (t // tp, source)}


CLIP = EncoderFamily(
    model_type="clip", slot="vision", modality="image", config_class=VisionEncoderConfig,
    from_model_args=from_model_args, planner_spec=planner_spec,
    build="megatron_mm.families.vit.model:build_vit",
    media="megatron_mm.families.vit.media:image_processor",
    # --sequence-parallel pads the patches (+ class token) to a multiple of TP; the layers
    # take it as padding (mask type ``padding``, either impl: families/vit/model.py)
    feature_tokens=fixed_feature_tokens("image"), fp8_token_counts=fp8_token_counts,
    fp8_shard_token_counts=fp8_shard_token_counts,
    builtin_data=BuiltinData("digits", "megatron_mm.data.digits:prepare_digits", ("image",)))
SIGLIP = dataclasses.replace(CLIP, model_type="siglip")
