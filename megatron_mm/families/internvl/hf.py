"""InternVL (InternViT + pixel shuffle + LayerNorm/MLP projector + LLM) for the
converter: on-disk layout, config-field rules, flags and the architecture's record."""

from __future__ import annotations

from ...hf.config_fields import Field, one_of, refuse_unsupported
from ...hf.families import IMAGE_INPUTS, Family, Flags, language_flags
from ...hf.layouts import Layout
from .hf_table import internvl_rules

# InternVL (-hf hub checkpoints and transformers 5 saves: the legacy prefixes; transformers
# 5's in-memory names load as they are).
INTERNVL = Layout(
    aliases=(
        ("language_model.model.", "model.language_model."),
        ("language_model.lm_head.", "lm_head."),
        ("language_model.", "model.language_model."),  # transformers 5 loads it too
        ("vision_tower.", "model.vision_tower."),
        ("multi_modal_projector.", "model.multi_modal_projector."),
    ),
    export=(
        ("model.language_model.", "language_model.model."),
        ("lm_head.", "language_model.lm_head."),
        ("model.vision_tower.", "vision_tower."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
    ),
)

# InternVL (InternViT + pixel shuffle + LayerNorm/MLP projector; models/internvit.py).
INTERNVL_VISION_FIELDS = (
    Field("model_type", one_of("internvl_vision"), "the InternVL tower is internvl_vision"),
    Field("hidden_act", one_of("gelu"), "InternViT's MLP uses exact 'gelu'"),
    Field("num_channels", one_of(3), "images are RGB", 3),
    Field("image_size", lambda v, _: len(set(v if isinstance(v, (list, tuple)) else [v])) == 1,
          "tiles are square"),
    Field("patch_size", lambda v, _: len(set(v if isinstance(v, (list, tuple)) else [v])) == 1,
          "patches are square"),
    Field("use_mask_token", one_of(False), "masked image modelling is not implemented",
          False),
    Field("use_absolute_position_embeddings", one_of(True),
          "only absolute position embeddings are implemented", True),
    Field("norm_type", one_of("layer_norm", "rms_norm"),
          "the layers' norm is 'layer_norm' or 'rms_norm'"),
)

INTERNVL_FIELDS = (
    Field("vision_feature_layer", lambda v, _: isinstance(v, int),
          "features of a single layer (an int) only"),
    Field("vision_feature_select_strategy", one_of("default"),
          "only 'default' (class token dropped): the pixel shuffle takes the patch grid"),
    Field("projector_hidden_act", one_of("gelu"),
          "the projector is LayerNorm-Linear-GELU-Linear"),
    Field("downsample_ratio", lambda v, _: v > 0 and (1 / v) == round(1 / v),
          "the pixel shuffle folds an integer n x n patches into one token (ratio 1/n)"),
)


def internvl_flags(hf_config) -> Flags:
    """InternVL: the tower, the pixel shuffle and the projector; the LLM's tied output
    layer is the top-level ``tie_word_embeddings`` (InternVLForConditionalGeneration ties
    by it, whatever the text config says)."""
    vision, text = hf_config.vision_config, hf_config.get_text_config()
    refuse_unsupported(vision, INTERNVL_VISION_FIELDS, "vision_config.")
    refuse_unsupported(hf_config, INTERNVL_FIELDS)
    size, patch = (v[0] if isinstance(v, (list, tuple)) else v
                   for v in (vision.image_size, vision.patch_size))
    language = language_flags(text, "text_config.",
                              tie_word_embeddings=getattr(hf_config, "tie_word_embeddings",
                                                          True))
    return {**language,
            "vision_model_type": "internvit", "vision_hidden_size": vision.hidden_size,
            "vision_num_layers": vision.num_hidden_layers,
            "vision_num_attention_heads": vision.num_attention_heads,
            "vision_ffn_hidden_size": vision.intermediate_size,
            "img_h": size, "img_w": size, "patch_dim": patch,
            "vision_feature_layer": hf_config.vision_feature_layer,
            "vision_norm_epsilon": vision.layer_norm_eps,
            "vision_norm_type": vision.norm_type,
            "downsample_ratio": hf_config.downsample_ratio,
            "projector_type": "mlp", "projector_ffn_hidden_size": text.hidden_size,
            "image_token_id": hf_config.image_token_id,
            "vision_qk_norm": bool(vision.use_qk_norm),
            "vision_add_qkv_bias": bool(vision.attention_bias),
            "vision_final_layernorm": not vision.use_mean_pooling}


ARCHITECTURES = {f.architecture: f for f in (
    # A batch's pixel_values are its images' tiles. Unused: the tower's layers past the
    # feature layer and its final LayerNorm when an earlier layer is taken.
    Family("InternVLForConditionalGeneration", INTERNVL, internvl_rules, True,
           (r"model\.vision_tower\.encoder\.layer\.\d+\..*",
            r"model\.vision_tower\.layernorm\..*"), IMAGE_INPUTS, flags=internvl_flags),
)}
