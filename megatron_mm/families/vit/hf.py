"""LLaVA-1.5 and LLaVA-OneVision (a CLIP or SigLIP tower + MLP projector + LLM) for the
converter: on-disk layout, config-field rules, flags and the architectures' records."""

from __future__ import annotations

from ...hf.config_fields import Field, one_of, refuse_unsupported
from ...hf.families import IMAGE_INPUTS, Family, Flags, language_flags
from ...hf.layouts import Layout
from .hf_table import llava_rules

# LLaVA-1.5 and LLaVA-OneVision (hf-offline notes, section 3).
LLAVA = Layout(
    aliases=(
        ("language_model.model.", "model.language_model."),  # hub 4.x, 5.x save
        ("language_model.lm_head.", "lm_head."),
        ("vision_tower.vision_model.", "model.vision_tower."),  # hub 4.x
        ("model.vision_tower.vision_model.", "model.vision_tower."),  # 4.52-4.57 save
        ("vision_tower.", "model.vision_tower."),  # 5.x save
        ("multi_modal_projector.", "model.multi_modal_projector."),
        ("image_newline", "model.image_newline"),
    ),
    export=(
        ("model.language_model.", "language_model.model."),
        ("lm_head.", "language_model.lm_head."),
        ("model.vision_tower.", "vision_tower.vision_model."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
        ("model.image_newline", "image_newline"),
    ),
)

# Hugging Face activation of each tower type; megatron_mm's ViT has exactly these.
VISION_ACTIVATION = {"clip": "quick_gelu", "siglip": "gelu_pytorch_tanh"}
VISION_TYPES = {"clip_vision_model": "clip", "siglip_vision_model": "siglip"}

VISION_FIELDS = (
    Field("model_type", lambda v, _: v in VISION_TYPES,
          f"the vision towers are {', '.join(VISION_TYPES)}"),
    Field("hidden_act",
          lambda v, c: v == VISION_ACTIVATION.get(VISION_TYPES.get(c.model_type)),
          "CLIP towers use 'quick_gelu', SigLIP towers 'gelu_pytorch_tanh'"),
    Field("num_channels", one_of(3), "images are RGB", 3),
)

# LLaVA-1.5 / LLaVA-OneVision top level (the towers and the LLM are checked above).
LLAVA_FIELDS = (
    Field("vision_feature_layer", lambda v, _: isinstance(v, int),
          "features of a single layer (an int) only"),
    Field("vision_feature_select_strategy", one_of("default", "full"),
          "'default' (drop the class token) or 'full'"),
    # "default" drops the first token: CLIP's class token, but a patch token of SigLIP.
    Field("vision_feature_select_strategy",
          lambda v, c: v == "full" or c.vision_config.model_type == "clip_vision_model",
          "'default' drops a SigLIP patch token, which megatron_mm does not reproduce; "
          "SigLIP checkpoints use 'full'"),
    Field("projector_hidden_act", one_of("gelu"), "the projector is Linear-GELU-Linear"),
    Field("multimodal_projector_bias", one_of(True), "the projector's linears have biases",
          True),
)


def vision_flags(hf_config) -> Flags:
    vision, text = hf_config.vision_config, hf_config.get_text_config()
    refuse_unsupported(vision, VISION_FIELDS, "vision_config.")
    refuse_unsupported(hf_config, LLAVA_FIELDS)
    kind = VISION_TYPES[vision.model_type]
    layer = hf_config.vision_feature_layer
    strategy = hf_config.vision_feature_select_strategy
    return {"vision_model_type": kind, "vision_hidden_size": vision.hidden_size,
            "vision_num_layers": vision.num_hidden_layers,
            "vision_num_attention_heads": vision.num_attention_heads,
            "vision_ffn_hidden_size": vision.intermediate_size,
            "img_h": vision.image_size, "img_w": vision.image_size,
            "patch_dim": vision.patch_size, "vision_feature_layer": layer,
            "vision_norm_epsilon": vision.layer_norm_eps,
            "projector_type": "mlp", "projector_ffn_hidden_size": text.hidden_size,
            "image_token_id": hf_config.image_token_id,
            "disable_vision_class_token": kind == "clip" and strategy == "default"}


def llava_flags(hf_config) -> Flags:
    return {**language_flags(hf_config.get_text_config(), "text_config."),
            **vision_flags(hf_config)}


# Hugging Face tensors the megatron_mm model has no use for: vision layers past the feature
# layer, the towers' final norm and pooling head.
_VISION_UNUSED = (r"model\.vision_tower\.encoder\.layers\.\d+\..*",
                  r"model\.vision_tower\.post_layernorm\..*", r"model\.vision_tower\.head\..*")

ARCHITECTURES = {f.architecture: f for f in (
    Family("LlavaForConditionalGeneration", LLAVA, llava_rules, True, _VISION_UNUSED,
           IMAGE_INPUTS, flags=llava_flags),
    # Without any-resolution tiling: one image = one tile at the tower's resolution.
    Family("LlavaOnevisionForConditionalGeneration", LLAVA, llava_rules, True,
           _VISION_UNUSED + (r"model\.image_newline",), IMAGE_INPUTS, flags=llava_flags),
)}
