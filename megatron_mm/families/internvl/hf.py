"""InternVL (InternViT + pixel shuffle + LayerNorm/MLP projector + LLM) for the
converter: on-disk layout, config-field rules, flags and the architecture's record."""

from __future__ import annotations

from typing import List

from ...hf.config_fields import Field, one_of, refuse_unsupported
from ...hf.families import IMAGE_INPUTS, Family, language_flags
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


def internvl_flags(hf_config) -> List[str]:
    """InternVL: the tower, the pixel shuffle and the projector; the LLM's tied output
    layer is the top-level ``tie_word_embeddings`` (InternVLForConditionalGeneration ties
    by it, whatever the text config says)."""
    vision, text = hf_config.vision_config, hf_config.get_text_config()
    refuse_unsupported(vision, INTERNVL_VISION_FIELDS, "vision_config.")
    refuse_unsupported(hf_config, INTERNVL_FIELDS)
    size, patch = (v[0] if isinstance(v, (list, tuple)) else v
                   for v in (vision.image_size, vision.patch_size))
    flags = ["--vision-model-type", "internvit", "--vision-hidden-size", vision.hidden_size,
             "--vision-num-layers", vision.num_hidden_layers,
             "--vision-num-attention-heads", vision.num_attention_heads,
             "--vision-ffn-hidden-size", vision.intermediate_size,
             "--img-h", size, "--img-w", size, "--patch-dim", patch,
             "--vision-feature-layer", hf_config.vision_feature_layer,
             "--vision-norm-epsilon", vision.layer_norm_eps,
             "--vision-norm-type", vision.norm_type,
             "--downsample-ratio", hf_config.downsample_ratio,
             "--projector-type", "mlp", "--projector-ffn-hidden-size", text.hidden_size,
             "--image-token-id", hf_config.image_token_id]
    for flag, on in (("--vision-qk-norm", vision.use_qk_norm),
                     ("--vision-add-qkv-bias", vision.attention_bias),
                     ("--vision-final-layernorm", not vision.use_mean_pooling)):
        if on:
            flags.append(flag)
    language = language_flags(text, "text_config.",
                              tie_word_embeddings=getattr(hf_config, "tie_word_embeddings",
                                                          True))
    return language + [str(f) for f in flags]


ARCHITECTURES = {f.architecture: f for f in (
    # A batch's pixel_values are its images' tiles. Unused: the tower's layers past the
    # feature layer and its final LayerNorm when an earlier layer is taken.
    Family("InternVLForConditionalGeneration", INTERNVL, internvl_rules, True,
           (r"model\.vision_tower\.encoder\.layer\.\d+\..*",
            r"model\.vision_tower\.layernorm\..*"), IMAGE_INPUTS, flags=internvl_flags),
)}
