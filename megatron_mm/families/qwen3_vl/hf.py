"""Qwen3-VL (``Qwen3VLForConditionalGeneration``) for the converter: weight table (vision
tower + final and DeepStack mergers + the Qwen3 LLM), flags from its config, and what
``compare`` feeds the megatron_mm model (media dict, M-RoPE position ids) for the Hugging
Face forward's keyword arguments. Its checkpoints, on the hub and saved by transformers 5,
name the LLM ``model.language_model.`` and the tower ``model.visual.``."""

from __future__ import annotations

from typing import Dict

import torch

from ...hf.config_fields import Field, one_of, refuse_unsupported
from ...hf.families import Family, Flags, TextModel, language_flags
from ...hf.layouts import CAUSAL_LM
from ...hf.mapping import prefixed
from ...hf.tables import LANGUAGE, OUTPUT_LAYER
from ..qwen2_5_vl.hf import hf_inputs, megatron_media
from ..qwen2_5_vl.hf import processor_flags as pixel_flags
from .hf_table import qwen3_vl_vision_rules

# Qwen3-VL's tower (sizes, patch, merge, position table and DeepStack layers map onto
# flags below).
VISION_FIELDS = (
    Field("hidden_act", one_of("gelu_pytorch_tanh"),
          "the Qwen3-VL vision MLP is tanh GELU ('gelu_pytorch_tanh')", "gelu_pytorch_tanh"),
    Field("in_channels", one_of(3), "images are RGB", 3),
    Field("rope_parameters.rope_type", one_of("axial"),
          "the tower's 2-D rotary embedding is 'axial'", "axial"),
    Field("num_position_embeddings",
          lambda v, _: int(v ** 0.5) ** 2 == v,
          "the learned position table is a square (side x side rows)"),
)

INPUTS = ("input_ids", "attention_mask", "pixel_values", "image_grid_thw",
          "pixel_values_videos", "video_grid_thw", "mm_token_type_ids")


def rules(hf_config):
    vision = hf_config.vision_config
    return (prefixed(LANGUAGE, "language_model.", "model.language_model.")
            + prefixed(OUTPUT_LAYER, "language_model.", "")
            + qwen3_vl_vision_rules("model.visual.", vision.in_channels,
                                    vision.temporal_patch_size, vision.patch_size,
                                    len(vision.deepstack_visual_indexes)))


def model_flags(hf_config) -> Flags:
    from ...hf.errors import ConversionError

    text, vision = hf_config.get_text_config(), hf_config.vision_config
    refuse_unsupported(vision, VISION_FIELDS, "vision_config.")
    if vision.out_hidden_size != text.hidden_size:
        raise ConversionError(f"config vision_config.out_hidden_size={vision.out_hidden_size}"
                              f" differs from text_config.hidden_size={text.hidden_size}: "
                              "the mergers feed the LLM")
    deepstack = list(vision.deepstack_visual_indexes)
    if len(deepstack) > text.num_hidden_layers:
        raise ConversionError(f"config vision_config.deepstack_visual_indexes={deepstack} "
                              f"feeds {len(deepstack)} LLM layers; the LLM has "
                              f"{text.num_hidden_layers} (text_config.num_hidden_layers)")
    return {**language_flags(text, "text_config.",
                             tie_word_embeddings=hf_config.tie_word_embeddings),
            **vision_flags(hf_config, deepstack)}


def vision_flags(hf_config, deepstack) -> Flags:
    """The tower's flags and the media tokens' ids (Qwen3.5's tower too, without
    DeepStack: ``deepstack`` empty)."""
    vision = hf_config.vision_config
    rope = dict(getattr(vision, "rope_parameters", None) or {})
    return {"vision_model_type": "qwen3_vl", "vision_hidden_size": vision.hidden_size,
            "vision_num_layers": vision.depth,
            "vision_num_attention_heads": vision.num_heads,
            "vision_ffn_hidden_size": vision.intermediate_size,
            "patch_dim": vision.patch_size,
            "vision_temporal_patch_size": vision.temporal_patch_size,
            "vision_spatial_merge_size": vision.spatial_merge_size,
            "vision_num_position_embeddings": vision.num_position_embeddings,
            "vision_deepstack_visual_indexes": list(deepstack),
            "vision_rope_theta": rope.get("rope_theta", 10000.0),
            "vision_norm_epsilon": 1e-6,  # the blocks' and the mergers' LayerNorm
            "image_token_id": hf_config.image_token_id,
            "video_token_id": hf_config.video_token_id}


# video_preprocessor_config.json's sampling fields -> flags (families/qwen3_vl/video.py)
SAMPLING_FLAGS = {"fps": "video_fps", "num_frames": "video_num_frames",
                  "min_frames": "video_min_frames", "max_frames": "video_max_frames"}


def processor_flags(hf_dir: str, hf_config) -> Flags:
    """Qwen2.5-VL's pixel bounds, plus the video processor's frame sampling; a video
    processor that the data path does not follow is refused, naming the field."""
    import json
    import os

    from ...hf.errors import ConversionError

    flags = pixel_flags(hf_dir, hf_config)
    path = os.path.join(hf_dir, "video_preprocessor_config.json")
    if not os.path.isfile(path):
        return flags
    with open(path) as f:
        cfg = json.load(f)
    for key, want, why in (("do_sample_frames", True, "every clip's frames are sampled"),
                           ("cap_pixels_per_frame", False, "no per-frame pixel cap is applied"),
                           ("do_resize", True, "every frame is resized by the rule")):
        if cfg.get(key) not in (None, want):
            raise ConversionError(f"{path}: {key}={cfg[key]!r} is not supported ({why}); "
                                  f"set it to {want!r} or leave it out")
    flags.update({flag: cfg[key] for key, flag in SAMPLING_FLAGS.items()
                  if cfg.get(key) is not None})
    return flags


def position_ids(hf_config, inputs: Dict[str, torch.Tensor]) -> torch.Tensor:
    """[3, B, S] M-RoPE positions, as ``get_rope_index`` gives them."""
    from .mrope_positions import qwen3_vl_batch_positions

    def listed(key):
        value = inputs.get(key)
        return None if value is None else value.tolist()

    pos, _ = qwen3_vl_batch_positions(
        inputs["input_ids"].tolist(), image_token_id=hf_config.image_token_id,
        video_token_id=hf_config.video_token_id, image_grid_thw=listed("image_grid_thw"),
        video_grid_thw=listed("video_grid_thw"), attention_mask=listed("attention_mask"),
        spatial_merge_size=hf_config.vision_config.spatial_merge_size)
    return torch.as_tensor(pos, dtype=torch.long)


# Qwen3-VL's text model: a Qwen3 decoder (q / k norms) rotating by interleaved M-RoPE;
# transformers' split of a head's rotary frequencies when the config names none.
TEXT_MODELS = {"qwen3_vl_text": TextModel(flags=("qk_layernorm",), mrope_section=(24, 20, 20),
                                          mrope_interleaved=True)}

ARCHITECTURES = {f.architecture: f for f in (
    # Native-resolution ViT (frame attention, DeepStack) + mergers + Qwen3 with M-RoPE.
    Family("Qwen3VLForConditionalGeneration", CAUSAL_LM, rules, True, inputs=INPUTS,
           flags=model_flags, config_rules=True, media=megatron_media,
           positions=position_ids, hf_inputs=hf_inputs, file_flags=processor_flags),
)}
