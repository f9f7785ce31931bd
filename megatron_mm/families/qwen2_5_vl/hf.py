"""Qwen2.5-VL (``Qwen2_5_VLForConditionalGeneration``) for the converter: on-disk layout,
weight table (vision tower + merger + the Qwen2 LLM), flags from its config, and what
``compare`` feeds the megatron_mm model (media dict, M-RoPE position ids) for the Hugging
Face forward's keyword arguments."""

from __future__ import annotations

from typing import Dict

import torch

from ...hf.config_fields import Field, one_of, refuse_unsupported
from ...hf.families import Family, Flags, TextModel, language_flags
from ...hf.layouts import Layout
from ...hf.mapping import prefixed
from ...hf.tables import LANGUAGE, OUTPUT_LAYER
from .hf_table import qwen2_5_vl_vision_rules

# Hub files (transformers 4.x) name the LLM ``model.`` and the tower ``visual.``;
# transformers 5 ``model.language_model.`` and ``model.visual.``.
QWEN2_5_VL = Layout(
    aliases=(
        ("model.language_model.", "model.language_model."),  # 5.x save: as is
        ("model.visual.", "model.visual."),
        ("model.", "model.language_model."),
        ("visual.", "model.visual."),
    ),
    export=(
        ("model.language_model.", "model."),
        ("model.visual.", "visual."),
    ),
)

# Qwen2.5-VL's tower (its sizes, window, merge and patch sizes map onto flags:
# families/qwen2_5_vl/hf.py).
QWEN2_5_VL_VISION_FIELDS = (
    Field("hidden_act", one_of("silu"), "the Qwen2.5-VL vision MLP is SwiGLU ('silu')",
          "silu"),
    Field("in_channels", one_of(3), "images are RGB", 3),
)

INPUTS = ("input_ids", "attention_mask", "pixel_values", "image_grid_thw",
          "pixel_values_videos", "video_grid_thw", "second_per_grid_ts", "mm_token_type_ids")


def rules(hf_config):
    vision = hf_config.vision_config
    return (prefixed(LANGUAGE, "language_model.", "model.language_model.")
            + prefixed(OUTPUT_LAYER, "language_model.", "")
            + qwen2_5_vl_vision_rules("model.visual.", vision.in_channels,
                                      vision.temporal_patch_size, vision.patch_size))


def model_flags(hf_config) -> Flags:
    from ...hf.errors import ConversionError

    text, vision = hf_config.get_text_config(), hf_config.vision_config
    refuse_unsupported(vision, QWEN2_5_VL_VISION_FIELDS, "vision_config.")
    if vision.out_hidden_size != text.hidden_size:
        raise ConversionError(f"config vision_config.out_hidden_size={vision.out_hidden_size}"
                              f" differs from text_config.hidden_size={text.hidden_size}: "
                              "the merger feeds the LLM")
    rope = dict(getattr(vision, "rope_parameters", None) or {})
    return {**language_flags(text, "text_config.",
                             tie_word_embeddings=hf_config.tie_word_embeddings),
            "vision_model_type": "qwen2_5_vl", "vision_hidden_size": vision.hidden_size,
            "vision_num_layers": vision.depth,
            "vision_num_attention_heads": vision.num_heads,
            "vision_ffn_hidden_size": vision.intermediate_size,
            "patch_dim": vision.patch_size,
            "vision_temporal_patch_size": vision.temporal_patch_size,
            "vision_spatial_merge_size": vision.spatial_merge_size,
            "vision_window_size": vision.window_size,
            "vision_fullatt_block_indexes": list(vision.fullatt_block_indexes),
            "vision_rope_theta": rope.get("rope_theta", 10000.0),
            "vision_norm_epsilon": 1e-6,  # the blocks' and the merger's RMSNorm
            "vision_tokens_per_second": vision.tokens_per_second,
            "image_token_id": hf_config.image_token_id,
            "video_token_id": hf_config.video_token_id}


def processor_flags(hf_dir: str, hf_config) -> Flags:
    """The pixel bounds of the directory's image and video processor configs
    (``min_pixels`` / ``max_pixels``, or transformers 5's ``size`` shortest / longest edge):
    they fix every item's token count. Patch, merge and temporal sizes must agree with the
    vision config."""
    import json
    import os

    from ...hf.errors import ConversionError

    vision, flags = hf_config.vision_config, {}
    for name, prefix in (("preprocessor_config.json", ""),
                         ("video_preprocessor_config.json", "video_")):
        path = os.path.join(hf_dir, name)
        if not os.path.isfile(path):
            continue
        with open(path) as f:
            cfg = json.load(f)
        for key, want in (("patch_size", vision.patch_size),
                          ("temporal_patch_size", vision.temporal_patch_size),
                          ("merge_size", vision.spatial_merge_size)):
            if cfg.get(key, want) != want:
                raise ConversionError(f"{path}: {key}={cfg[key]} but the vision config's is "
                                      f"{want}")
        size = cfg.get("size") or {}
        for dest, keys in (("min_pixels", ("min_pixels", "shortest_edge")),
                           ("max_pixels", ("max_pixels", "longest_edge"))):
            value = cfg.get(keys[0]) or size.get(keys[1])
            if value:
                flags[prefix + dest] = int(value)
    return flags


def megatron_media(inputs: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """The batch media the qwen2_5_vl encoder reads (``families/qwen2_5_vl/encoder.py``)."""
    media = {}
    for rows, grid, kind in (("pixel_values", "image_grid_thw", "image"),
                             ("pixel_values_videos", "video_grid_thw", "video")):
        if rows in inputs:
            media[kind] = inputs[rows].float()
            media[f"{kind}_grid_thw"] = inputs[grid].long()
    return media


def position_ids(hf_config, inputs: Dict[str, torch.Tensor]) -> torch.Tensor:
    """[3, B, S] M-RoPE positions, as ``get_rope_index`` gives them (data/mrope_positions)."""
    from .mrope_positions import batch_mrope_positions

    def listed(key):
        value = inputs.get(key)
        return None if value is None else value.tolist()

    vision = hf_config.vision_config
    pos, _ = batch_mrope_positions(
        inputs["input_ids"].tolist(), image_token_id=hf_config.image_token_id,
        video_token_id=hf_config.video_token_id, image_grid_thw=listed("image_grid_thw"),
        video_grid_thw=listed("video_grid_thw"),
        second_per_grid_ts=listed("second_per_grid_ts"),
        attention_mask=listed("attention_mask"),
        spatial_merge_size=vision.spatial_merge_size,
        tokens_per_second=vision.tokens_per_second)
    return torch.as_tensor(pos, dtype=torch.long)


def hf_inputs(hf_config, inputs: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """The Hugging Face forward's arguments, with the ``mm_token_type_ids`` its processor
    adds (transformers 5 computes M-RoPE positions only with them; text positions
    otherwise)."""
    from .mrope_positions import token_kinds

    if "mm_token_type_ids" in inputs or not any(k in inputs for k in ("image_grid_thw",
                                                                    "video_grid_thw")):
        return inputs
    kinds = token_kinds(inputs["input_ids"].numpy(), hf_config.image_token_id,
                        hf_config.video_token_id)
    return {**inputs, "mm_token_type_ids": torch.from_numpy(kinds)}


# Text models of Qwen2-VL and Qwen2.5-VL: Qwen2 decoders (q/k/v biases) rotating by M-RoPE
# (3-D positions); transformers' split of a head's rotary frequencies when the config names
# none.
TEXT_MODELS = {t: TextModel(flags=("add_qkv_bias",), mrope_section=(16, 24, 24))
               for t in ("qwen2_vl_text", "qwen2_5_vl_text")}

ARCHITECTURES = {f.architecture: f for f in (
    # Native-resolution ViT (window attention) + patch merger + Qwen2 with M-RoPE.
    Family("Qwen2_5_VLForConditionalGeneration", QWEN2_5_VL, rules, True, inputs=INPUTS,
           flags=model_flags, config_rules=True, media=megatron_media,
           positions=position_ids, hf_inputs=hf_inputs, file_flags=processor_flags),
)}
