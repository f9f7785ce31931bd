"""The Qwen2.5-VL vision encoder (native-resolution images and video frames, window
attention, 2-D RoPE, 2x2 patch merger): every item of a batch, images then videos, runs
as one packed sequence of patches; each item hands the LLM t * h * w / 4 tokens from its
grid. The merger MLP is this family's projector."""

from __future__ import annotations

import math

from ...config import ConfigError
from ...data.item_tags import IMAGE_TAGS
from ...plan.model import EncoderSpec, patch_embed_flops
from ..encoder import BuiltinData, EncoderFamily, encoder_transformer
from .config import Qwen2_5VLVisionConfig
from .flags import Qwen2_5VLFlags
from .geometry import QwenVLGeometry, image_grid

# The batch's media keys (``data/media_processors.py: QwenVLProcessor``): patch rows of
# images and of videos, and each item's grid (t, h, w) in patches.
IMAGE, VIDEO = "image", "video"
IMAGE_GRID, VIDEO_GRID = "image_grid_thw", "video_grid_thw"
SECONDS = "second_per_grid_ts"  # per video


CHECKPOINT_FLAGS = (
    "vision_window_size", "vision_fullatt_block_indexes", "vision_spatial_merge_size",
    "vision_temporal_patch_size", "vision_rope_theta", "vision_tokens_per_second",
    "min_pixels", "max_pixels", "video_min_pixels", "video_max_pixels",
)


def default_fullatt_block_indexes(num_layers: int) -> tuple:
    """Qwen2.5-VL's layout: the last layer of every 8 (at least the last layer)."""
    return tuple(i for i in range(num_layers) if i % 8 == 7) or (num_layers - 1,)


def from_model_args(model) -> Qwen2_5VLVisionConfig:
    layers, own = model.vision_num_layers, model.families[Qwen2_5VLFlags]
    return Qwen2_5VLVisionConfig(
        hidden_size=model.vision_hidden_size, num_layers=layers,
        num_attention_heads=model.vision_num_attention_heads,
        ffn_hidden_size=model.vision_ffn_hidden_size or 4 * model.vision_hidden_size,
        out_hidden_size=model.hidden_size, patch_size=model.patch_dim,
        temporal_patch_size=own.vision_temporal_patch_size,
        spatial_merge_size=own.vision_spatial_merge_size,
        window_size=own.vision_window_size,
        fullatt_block_indexes=tuple(own.vision_fullatt_block_indexes
                                    or default_fullatt_block_indexes(layers)),
        rope_theta=own.vision_rope_theta,
        norm_epsilon=model.vision_norm_epsilon or 1e-6,
        min_pixels=own.min_pixels, max_pixels=own.max_pixels,
        video_min_pixels=own.video_min_pixels, video_max_pixels=own.video_max_pixels,
        tokens_per_second=own.vision_tokens_per_second)


def geometry(enc: Qwen2_5VLVisionConfig, **extra) -> QwenVLGeometry:
    """The processor geometry the config fixes."""
    return QwenVLGeometry(patch_size=enc.patch_size, temporal_patch_size=enc.temporal_patch_size,
                          merge_size=enc.spatial_merge_size, min_pixels=enc.min_pixels,
                          max_pixels=enc.max_pixels, video_min_pixels=enc.video_min_pixels,
                          video_max_pixels=enc.video_max_pixels, **extra)


def planner_spec(name: str, enc: Qwen2_5VLVisionConfig, items_per_sample: int,
                 common: dict) -> EncoderSpec:
    """Costs of square images of ``--min-pixels``: the least every image costs (items vary
    with each image's size; the data balancer reads every sample's own patch count)."""
    side = math.isqrt(enc.min_pixels)
    t, h, w = image_grid(side, side, geometry(enc))
    patches = t * h * w
    common = {**common, "projector_input_size": enc.merged_size,
              "projector_ffn_hidden_size": enc.merged_size}
    return EncoderSpec(
        name=name, modality="vision",
        transformer=encoder_transformer(enc, enc.num_layers, gated_linear_unit=True),
        tokens_per_item=patches, llm_tokens_per_item=patches // enc.merge_unit,
        items_per_sample=items_per_sample,
        embed_flops_per_token=patch_embed_flops(enc.patch_size, enc.hidden_size,
                                                enc.in_channels, enc.temporal_patch_size),
        embed_params=enc.patch_input_size * enc.hidden_size,
        **common)


def item_grids(media: dict) -> list:
    """Every item's grid (t, h, w), images then videos, as Python ints (host media)."""
    grids = []
    for key in (IMAGE_GRID, VIDEO_GRID):
        g = media.get(key)
        if g is not None and g.shape[0]:  # the training step reads them before the copy
            grids += [tuple(int(v) for v in row) for row in g.tolist()]
    return grids


def feature_tokens(enc: Qwen2_5VLVisionConfig, media: dict):
    """Items (images and videos) and each one's LLM tokens (t * h * w / merge unit), per
    modality."""
    from ...models.batch_layout import MediaMismatchError  # torch: only with a batch

    for rows, grid, what in ((IMAGE, IMAGE_GRID, "image"), (VIDEO, VIDEO_GRID, "video")):
        pixels, grids = media.get(rows), media.get(grid)
        n_rows = 0 if pixels is None else pixels.shape[0]
        patches = 0 if grids is None else int(grids.prod(-1).sum()) if grids.shape[0] else 0
        if n_rows != patches:
            raise MediaMismatchError(f"batch has {n_rows} {what} patch rows but its grids "
                                     f"(media[{grid!r}]) give {patches}")
    tokens = {}
    for kind, key in ((IMAGE, IMAGE_GRID), (VIDEO, VIDEO_GRID)):
        grids = item_grids({key: media[key]} if key in media else {})
        tokens[kind] = [t * h * w // enc.merge_unit for t, h, w in grids]
    return len(tokens[IMAGE]) + len(tokens[VIDEO]), tokens


def hidden_shape(enc: Qwen2_5VLVisionConfig, media: dict):
    """All items' patches as one sequence: (patches, 1)."""
    return sum(t * h * w for t, h, w in item_grids(media)), 1


def fp8_token_counts(name: str, enc: Qwen2_5VLVisionConfig) -> dict:
    raise ConfigError(f"--fp8-modules {name}: the qwen2_5_vl encoder's tokens per item vary "
                      "with each image's size, so FP8's alignment cannot hold; keep it (and "
                      f"{name}-projector) out of --fp8-modules")


def check_sequence_parallel(name: str, enc: Qwen2_5VLVisionConfig, tp: int, impl: str) -> None:
    """The packed patches are padded with whole merge units to a multiple of TP and the
    padding masked, which only the local attention takes."""
    if impl != "local":
        raise ConfigError(f"--sequence-parallel pads the {name} encoder's packed patches "
                          "and masks the padding, which only the local attention takes: "
                          "pass --transformer-impl local")


QWEN2_5_VL = EncoderFamily(
    model_type="qwen2_5_vl", slot="vision", modality=IMAGE, extra_modalities=(VIDEO,),
    config_class=Qwen2_5VLVisionConfig, from_model_args=from_model_args, planner_spec=planner_spec,
    build="megatron_mm.families.qwen2_5_vl.model:build_qwen2_5_vl_encoder",
    projector="megatron_mm.families.qwen2_5_vl.model:build_merger",
    prepare_batch="megatron_mm.families.qwen2_5_vl.model:prepare_batch",
    select_items="megatron_mm.families.qwen2_5_vl.model:select_items",
    media="megatron_mm.families.qwen2_5_vl.media_processor:qwen_vl_processor",
    feature_tokens=feature_tokens, hidden_shape=hidden_shape,
    fp8_token_counts=fp8_token_counts, check_sequence_parallel=check_sequence_parallel,
    flags=Qwen2_5VLFlags, checkpoint_flags=CHECKPOINT_FLAGS,
    builtin_data=BuiltinData("digits_qwen",
                             "megatron_mm.families.qwen2_5_vl.digits:prepare_digits_qwen",
                             (IMAGE, VIDEO)),
    # the chat template's <|vision_start|><|image_pad|><|vision_end|> (<|video_pad|>) per item
    item_tags={IMAGE: IMAGE_TAGS["qwen-vl"], VIDEO: IMAGE_TAGS["qwen-vl"]})
