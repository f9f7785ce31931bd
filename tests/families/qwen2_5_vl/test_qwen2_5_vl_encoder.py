"""The Qwen2.5-VL family in the multimodal model: two images of different sizes and a video
in one batch (the video in the first sample, after its image) run as one packed sequence;
images' features fill the image tokens and the video's the video tokens, equal to the
standalone tower and merger (``test_qwen2_5_vl_vision.py`` checks that one against
transformers); the pipeline message of a cut inside the tower has the host-known shape."""

import pytest
import torch

from megatron_mm.config import ConfigError, LanguageModelConfig, MultimodalModelConfig
from megatron_mm.families import family
from megatron_mm.families.qwen2_5_vl.config import Qwen2_5VLVisionConfig

IMAGE_ID, VIDEO_ID = 250, 251
GRIDS = {"image": [(1, 8, 12), (1, 4, 4)], "video": [(2, 4, 8)]}
ENC = dict(hidden_size=32, num_layers=2, num_attention_heads=4, ffn_hidden_size=64,
           out_hidden_size=64, window_size=56, fullatt_block_indexes=(1,))


def _build(placement=None):
    from megatron_mm.models import BuildSettings, build_model

    cfg = MultimodalModelConfig(
        encoders={"vision": Qwen2_5VLVisionConfig(**ENC)},
        language=LanguageModelConfig(vocab_size=256, hidden_size=64, num_attention_heads=4))
    torch.manual_seed(0)
    return build_model(cfg, BuildSettings(), {"image": IMAGE_ID, "video": VIDEO_ID},
                       placement=placement)


def _batch():
    """Sample 0: text, image 0 (24 tokens), text, the video (16 tokens); sample 1: text,
    image 1 (4 tokens)."""
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 200, (2, 48), generator=gen)
    tokens[0, 2:26] = IMAGE_ID
    tokens[0, 30:46] = VIDEO_ID
    tokens[1, 5:9] = IMAGE_ID
    media = {}
    for kind, grids in GRIDS.items():
        patches = sum(t * h * w for t, h, w in grids)
        media[kind] = torch.randn(patches, 3 * 2 * 14 * 14, generator=gen)
        media[f"{kind}_grid_thw"] = torch.tensor(grids)
    return tokens, torch.arange(48).expand(2, -1), media


def _standalone(model):
    """The tower and merger of the Qwen2.5-VL vision module alone, with the model's weights."""
    from megatron_mm.families.qwen2_5_vl.vision import Qwen2_5VLVisionWithMerger
    from megatron_mm.families.qwen2_5_vl.transformer_config import (
        qwen2_5_vl_merger_transformer_config,
        qwen2_5_vl_vision_transformer_config,
    )
    from megatron_mm.models.transformer_configs import BuildSettings

    enc = model.mm_config.encoders["vision"]
    tower = Qwen2_5VLVisionWithMerger(qwen2_5_vl_vision_transformer_config(enc, BuildSettings()),
                                      qwen2_5_vl_merger_transformer_config(enc, BuildSettings()),
                                      enc)
    mine = {k: v for k, v in model.state_dict().items()
            if k.startswith(("vision_model.", "vision_projection."))}
    tower.load_state_dict({**tower.state_dict(), **mine}, strict=True)
    return tower


def test_images_and_video_fill_their_placeholders(gloo_world):
    model = _build()
    tokens, pos, media = _batch()
    merged = model.embed(tokens, pos, media)  # [S, B, H]
    grids = GRIDS["image"] + GRIDS["video"]
    expected = _standalone(model)(torch.cat([media["image"], media["video"]]), grids)
    image0, image1, video = expected.split([24, 4, 16])
    torch.testing.assert_close(merged[2:26, 0], image0)
    torch.testing.assert_close(merged[5:9, 1], image1)
    torch.testing.assert_close(merged[30:46, 0], video)
    text = model.language_model.embedding(input_ids=tokens, position_ids=pos)
    torch.testing.assert_close(merged[26:30, 0], text[26:30, 0])


def test_layout_counts_items_and_packs_patches(gloo_world):
    from megatron_mm.models.batch_layout import MediaMismatchError, batch_layout

    model = _build()
    tokens, _, media = _batch()
    layout = batch_layout(model.mm_config, model.media_token_ids, tokens, media)
    patches = sum(t * h * w for g in GRIDS.values() for t, h, w in g)
    assert layout.items["vision"] == 3
    assert layout.hidden_shapes["vision"] == (patches, 1)
    assert layout.encoder_batches["vision"].layout.num_patches == patches
    swapped = tokens.clone()
    swapped[0, 30] = IMAGE_ID  # right total, but one video placeholder became an image's
    with pytest.raises(MediaMismatchError, match="29 image placeholder tokens but its image "
                                                 "items give 28"):
        batch_layout(model.mm_config, model.media_token_ids, swapped, media)
    tokens[1, 9] = IMAGE_ID  # one placeholder more than the grids give
    with pytest.raises(MediaMismatchError, match="placeholder tokens"):
        batch_layout(model.mm_config, model.media_token_ids, tokens, media)
    media["image_grid_thw"] = torch.tensor([(1, 8, 12), (1, 4, 8)])
    with pytest.raises(MediaMismatchError, match="patch rows"):
        batch_layout(model.mm_config, model.media_token_ids, tokens, media)


def test_cp_ranks_items_put_together_give_the_batch_features(gloo_world):
    """--vision-dp-when-cp on the host: each CP rank's share of the items (image 0: 24
    tokens on rank 0; image 1 and the video: 4 + 16 on rank 1), encoded alone and put in
    the share's order, gives the whole batch's features."""
    from megatron_mm.models.batch_layout import EncoderCP, batch_layout

    model = _build()
    tokens, _, media = _batch()
    whole = model.layout(tokens, media)
    model.bind_batches(whole)
    expected = model.project("vision", model.run_encoder("vision", media, None))[0]
    parts = []
    for rank in range(2):
        layout = batch_layout(model.mm_config, model.media_token_ids, tokens, media,
                              encoder_cp=EncoderCP(2, rank, None))
        assert layout.shares["vision"].counts == [24, 20]
        assert layout.items["vision"] == [1, 2][rank]
        model.bind_batches(layout)
        mine = layout.encoder_media["vision"]
        parts.append(model.project("vision", model.run_encoder("vision", mine, None))[0])
    gathered = torch.empty_like(expected)
    gathered[layout.shares["vision"].order] = torch.cat(parts)
    torch.testing.assert_close(gathered, expected)


def test_flags_build_the_config():
    import dataclasses

    from megatron_mm.families.qwen2_5_vl.flags import Qwen2_5VLFlags
    from megatron_mm.training.cli.arguments import build_parser
    from megatron_mm.training.config.run_config import group_of_flags

    model = group_of_flags("model", build_parser().parse_args([
        "--vision-model-type", "qwen2_5_vl", "--vision-num-layers", "16", "--patch-dim", "14",
        "--hidden-size", "64", "--max-pixels", "50000", "--vision-window-size", "56"]))
    enc = family("qwen2_5_vl").from_model_args(model)
    assert enc.fullatt_block_indexes == (7, 15)
    assert (enc.out_hidden_size, enc.max_pixels, enc.window_size) == (64, 50000, 56)
    model = dataclasses.replace(model, families=model.families.replace(
        Qwen2_5VLFlags, vision_fullatt_block_indexes=[16]))
    with pytest.raises(ConfigError, match="fullatt-block-indexes"):
        family("qwen2_5_vl").from_model_args(model)


def test_sequence_parallel_on_te_and_fp8_are_refused():
    qwen = family("qwen2_5_vl")
    enc = Qwen2_5VLVisionConfig(**ENC)
    qwen.check_sequence_parallel("vision", enc, 2, "local")  # padded and masked
    with pytest.raises(ConfigError, match="--transformer-impl local"):
        qwen.check_sequence_parallel("vision", enc, 2, "transformer_engine")
    with pytest.raises(ConfigError, match="--fp8-modules"):
        qwen.fp8_token_counts("vision", enc)


def test_bidirectional_media_attention_is_refused():
    """Bidirectional media attention splits placeholder runs into items by a fixed count;
    Qwen2.5-VL's items have their own lengths (and its LLM attends causally)."""
    from types import SimpleNamespace

    from megatron_mm.training.assembly.attention import AttentionSettings

    config = MultimodalModelConfig(encoders={"vision": Qwen2_5VLVisionConfig(**ENC)})
    run = SimpleNamespace(model_config=config,
                          parallel=SimpleNamespace(media_attention="bidirectional"))
    with pytest.raises(ConfigError, match="--media-attention causal"):
        AttentionSettings.from_config(run, tokenizer=None)
