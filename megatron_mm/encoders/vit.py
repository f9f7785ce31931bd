"""The CLIP and SigLIP ViTs (LLaVA-1.5, OneVision): fixed-size square images, one
``VisionEncoderConfig`` and one module (``models/vision.py``) for both."""

from __future__ import annotations

import dataclasses

from ..config import ConfigError, VisionEncoderConfig
from ..plan.model import EncoderSpec, patch_embed_flops
from .family import BuiltinData, EncoderFamily, encoder_transformer, fixed_feature_tokens


def from_args(args) -> VisionEncoderConfig:
    return VisionEncoderConfig(
        model_type=args.vision_model_type,
        hidden_size=args.vision_hidden_size,
        num_layers=args.vision_num_layers,
        num_attention_heads=args.vision_num_attention_heads,
        ffn_hidden_size=args.vision_ffn_hidden_size,
        img_h=args.img_h, img_w=args.img_w, patch_dim=args.patch_dim,
        feature_layer=args.vision_feature_layer,
        drop_class_token=args.disable_vision_class_token,
        layernorm_epsilon=args.vision_norm_epsilon,
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


def check_sequence_parallel(name: str, enc: VisionEncoderConfig, tp: int, impl: str) -> None:
    """The model pads the patches (+ class token) to a multiple of TP and masks the
    padding, which only the local attention takes."""
    t = enc.num_patches + int(enc.has_class_token)
    if t % tp and impl == "transformer_engine":
        raise ConfigError(
            f"--sequence-parallel pads the {name} encoder's {t} tokens to a multiple of "
            f"--tensor-model-parallel-size {tp} and masks the padding, which only the "
            f"local attention takes: pass --transformer-impl local (or a patch count plus "
            f"class token divisible by {tp})")


CLIP = EncoderFamily(
    model_type="clip", slot="vision", modality="image", config_class=VisionEncoderConfig,
    from_args=from_args, planner_spec=planner_spec,
    build="megatron_mm.models.vision:build_vit",
    media="megatron_mm.data.media_processors:image_processor",
    feature_tokens=fixed_feature_tokens("image"), fp8_token_counts=fp8_token_counts,
    check_sequence_parallel=check_sequence_parallel,
    builtin_data=BuiltinData("digits", "megatron_mm.data.digits:prepare_digits", ("image",)))
SIGLIP = dataclasses.replace(CLIP, model_type="siglip")
