"""The Qwen3-VL vision encoder (native-resolution images and video frames, attention
within each frame, a learned position table plus 2-D RoPE, DeepStack): every item of a
batch, images then videos, runs as one packed sequence of patches, as Qwen2.5-VL's does
(whose grids, token counts, flags and media this family shares); each item hands the LLM
t * h * w / 4 tokens. The final and DeepStack mergers are this family's projector."""

from __future__ import annotations

import math

from ...config import ConfigError
from ...data.item_tags import IMAGE_TAGS
from ...plan.model import EncoderSpec, patch_embed_flops
from ..encoder import BuiltinData, EncoderFamily, encoder_transformer
from ..qwen2_5_vl.encoder import (IMAGE, VIDEO, check_sequence_parallel, feature_tokens,
                                  geometry, hidden_shape)
from ..qwen2_5_vl.flags import Qwen2_5VLFlags
from ..qwen2_5_vl.geometry import image_grid
from .config import Qwen3VLVisionConfig
from .flags import Qwen3VLFlags
from .video import VideoSampling

# Qwen3-VL-8B's DeepStack layers (of 27); a smaller tower keeps those below its last.
DEEPSTACK_VISUAL_INDEXES = (8, 16, 24)


CHECKPOINT_FLAGS = ("vision_deepstack_visual_indexes", "vision_num_position_embeddings",
                    "video_fps", "video_num_frames", "video_min_frames", "video_max_frames")


def from_model_args(model) -> Qwen3VLVisionConfig:
    layers = model.vision_num_layers
    shared, own = model.families[Qwen2_5VLFlags], model.families[Qwen3VLFlags]
    deepstack = own.vision_deepstack_visual_indexes
    if deepstack is None:
        deepstack = [i for i in DEEPSTACK_VISUAL_INDEXES if i < layers - 1]
    return Qwen3VLVisionConfig(
        hidden_size=model.vision_hidden_size, num_layers=layers,
        num_attention_heads=model.vision_num_attention_heads,
        ffn_hidden_size=model.vision_ffn_hidden_size or 4 * model.vision_hidden_size,
        out_hidden_size=model.hidden_size, patch_size=model.patch_dim,
        temporal_patch_size=shared.vision_temporal_patch_size,
        spatial_merge_size=shared.vision_spatial_merge_size,
        num_position_embeddings=own.vision_num_position_embeddings,
        deepstack_visual_indexes=tuple(deepstack), rope_theta=shared.vision_rope_theta,
        norm_epsilon=model.vision_norm_epsilon or 1e-6,
        min_pixels=shared.min_pixels, max_pixels=shared.max_pixels,
        video_min_pixels=shared.video_min_pixels, video_max_pixels=shared.video_max_pixels,
        video_fps=own.video_fps, video_num_frames=own.video_num_frames,
        video_min_frames=own.video_min_frames, video_max_frames=own.video_max_frames)


def video_sampling(enc: Qwen3VLVisionConfig) -> VideoSampling:
    return VideoSampling(fps=enc.video_fps, num_frames=enc.video_num_frames,
                         min_frames=enc.video_min_frames, max_frames=enc.video_max_frames)


def planner_spec(name: str, enc: Qwen3VLVisionConfig, items_per_sample: int,
                 common: dict) -> EncoderSpec:
    """Costs of square images of ``--min-pixels``: the least every image costs (the data
    balancer reads every sample's own patch count)."""
    side = math.isqrt(enc.min_pixels)
    t, h, w = image_grid(side, side, geometry(enc))
    patches = t * h * w
    common = {**common, "projector_input_size": enc.merged_size,
              "projector_ffn_hidden_size": enc.merged_size}
    return EncoderSpec(
        name=name, modality="vision", transformer=encoder_transformer(enc, enc.num_layers),
        tokens_per_item=patches, llm_tokens_per_item=patches // enc.merge_unit,
        items_per_sample=items_per_sample,
        embed_flops_per_token=patch_embed_flops(enc.patch_size, enc.hidden_size,
                                                enc.in_channels, enc.temporal_patch_size),
        embed_params=(enc.patch_input_size + 1) * enc.hidden_size
        + enc.num_position_embeddings * enc.hidden_size,
        deepstack_layers=enc.deepstack_visual_indexes, **common)


def fp8_token_counts(name: str, enc: Qwen3VLVisionConfig) -> dict:
    raise ConfigError(f"--fp8-modules {name}: the qwen3_vl encoder's tokens per item vary "
                      "with each image's size, so FP8's alignment cannot hold; keep it (and "
                      f"{name}-projector) out of --fp8-modules")


QWEN3_VL = EncoderFamily(
    model_type="qwen3_vl", slot="vision", modality=IMAGE, extra_modalities=(VIDEO,),
    config_class=Qwen3VLVisionConfig, from_model_args=from_model_args,
    planner_spec=planner_spec,
    build="megatron_mm.families.qwen3_vl.model:build_qwen3_vl_encoder",
    projector="megatron_mm.families.qwen3_vl.model:build_mergers",
    prepare_batch="megatron_mm.families.qwen3_vl.model:prepare_batch",
    select_items="megatron_mm.families.qwen2_5_vl.model:select_items",
    media="megatron_mm.families.qwen3_vl.media_processor:qwen3_vl_processor",
    feature_tokens=feature_tokens, hidden_shape=hidden_shape,
    fp8_token_counts=fp8_token_counts, check_sequence_parallel=check_sequence_parallel,
    flags=Qwen3VLFlags, checkpoint_flags=CHECKPOINT_FLAGS,
    builtin_data=BuiltinData("digits_qwen3",
                             "megatron_mm.families.qwen3_vl.digits:prepare_digits_qwen3",
                             (IMAGE, VIDEO)),
    item_tags={IMAGE: IMAGE_TAGS["qwen-vl"], VIDEO: IMAGE_TAGS["qwen-vl"]})
