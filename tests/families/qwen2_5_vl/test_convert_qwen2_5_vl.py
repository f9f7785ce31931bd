"""Qwen2.5-VL (window-attention ViT + patch merger + Qwen2 with M-RoPE) -> megatron_mm: on
a batch with two images of different sizes and a video, ``compare``'s logits equal
transformers' at TP=1, TP=2 and PP=2 (max |diff| <= 1e-4, fp32); export gives back the
same tensors; config fields the model does not reproduce are refused."""

import pytest
import torch

from megatron_mm.hf.errors import ConversionError

VOCAB, IMAGE, VIDEO, START, END = 250, 247, 248, 245, 246
TOLERANCE = 1e-4
SEQ = 48
GRIDS = {"image": [(1, 8, 12), (1, 4, 4)], "video": [(2, 4, 8)]}  # 24, 4 and 16 tokens


def _config(**vision):
    from transformers import Qwen2_5_VLConfig

    config = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, rms_norm_eps=1e-5, bos_token_id=0,
                         eos_token_id=1,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                          "mrope_section": [2, 3, 3]}),
        vision_config={**dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=4,
                              out_hidden_size=64, window_size=56, fullatt_block_indexes=[1],
                              tokens_per_second=2), **vision},
        image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START,
        vision_end_token_id=END, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False)
    config.architectures = ["Qwen2_5_VLForConditionalGeneration"]
    return config


def _tiny():
    import transformers

    torch.manual_seed(0)
    model = transformers.Qwen2_5_VLForConditionalGeneration(_config()).eval()
    with torch.no_grad():  # random norms and biases: a mapping mix-up cannot hide
        for n, p in model.named_parameters():
            if "norm" in n or "ln_q" in n or n.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
            if "language_model" in n and ("q_proj" in n or "k_proj" in n):
                p.mul_(4.0)  # sharp attention: the 3-D positions show in the logits
    return model


def _inputs():
    """Row 0: image 0, the video, text; row 1: image 1 (every row unpadded, length SEQ)."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(2, 240, (2, SEQ), generator=gen)
    ids[0, 2], ids[0, 3:27], ids[0, 27] = START, IMAGE, END
    ids[0, 30], ids[0, 31:47], ids[0, 47] = START, VIDEO, END
    ids[1, 5], ids[1, 6:10], ids[1, 10] = START, IMAGE, END
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    for kind, rows, grid in (("image", "pixel_values", "image_grid_thw"),
                             ("video", "pixel_values_videos", "video_grid_thw")):
        patches = sum(t * h * w for t, h, w in GRIDS[kind])
        inputs[rows] = torch.randn(patches, 3 * 2 * 14 * 14, generator=gen)
        inputs[grid] = torch.tensor(GRIDS[kind])
    inputs["second_per_grid_ts"] = torch.tensor([1.0])
    return inputs


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from megatron_mm.hf.convert import import_hf
    from megatron_mm.hf.world import single_rank_world

    root = tmp_path_factory.mktemp("qwen2_5_vl")
    model = _tiny()
    model.save_pretrained(str(root / "hf"))
    _processor_config(root / "hf", min_pixels=784, max_pixels=50176)
    with single_rank_world():
        import_hf(str(root / "hf"), str(root / "ckpt"), tensor_model_parallel_size=2)
    return model, str(root / "hf"), str(root / "ckpt")


def _processor_config(directory, **fields):
    import json

    (directory / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Qwen2VLImageProcessor", "patch_size": 14,
        "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5] * 3,
        "image_std": [0.5] * 3, **fields}))


def test_pixel_bounds_come_from_the_processor_config(converted, tmp_path):
    """The checkpoint's --min-pixels / --max-pixels are the processor config's (they fix
    every item's token count); a patch size other than the tower's is refused."""
    from megatron_mm.hf.compare import checkpoint_run_config
    from megatron_mm.families.qwen2_5_vl.hf import processor_flags

    from megatron_mm.families.qwen2_5_vl.flags import Qwen2_5VLFlags

    own = checkpoint_run_config(converted[2]).model.families[Qwen2_5VLFlags]
    assert (own.min_pixels, own.max_pixels) == (784, 50176)
    _processor_config(tmp_path, size={"shortest_edge": 1568, "longest_edge": 3136})
    assert processor_flags(str(tmp_path), _config()) == {"min_pixels": 1568,
                                                          "max_pixels": 3136}
    _processor_config(tmp_path, patch_size=16)
    with pytest.raises(ConversionError, match="patch_size=16 but the vision config's is 14"):
        processor_flags(str(tmp_path), _config())


@pytest.mark.parametrize("tp,pp", [(1, 1), pytest.param(2, 1, marks=pytest.mark.processes),
                                   pytest.param(1, 2, marks=pytest.mark.processes)])
def test_logits_equal_transformers(converted, tp, pp):
    from megatron_mm.hf.compare import compare

    _, hf_dir, ckpt = converted
    diff, shape = compare(hf_dir, ckpt, _inputs(), tp=tp, pp=pp)
    print(f"qwen2.5-vl TP={tp} PP={pp}: max abs logit difference {diff:.3g}")
    assert tuple(shape) == (2, SEQ, VOCAB)
    assert diff <= TOLERANCE


def test_positions_and_video_matter(converted, gloo_world):
    """The comparison is sensitive: text positions, or the video's features swapped for
    zeros, move the logits by far more than the tolerance."""
    from megatron_mm.hf.compare import load_converted, logits
    from megatron_mm.families.qwen2_5_vl.hf import megatron_media, position_ids

    hf_model, _, ckpt = converted
    inputs = _inputs()
    model = load_converted(ckpt)
    media = megatron_media(inputs)
    right = logits(model, inputs["input_ids"], media, position_ids(hf_model.config, inputs))
    text = logits(model, inputs["input_ids"], media)
    media["video"] = torch.zeros_like(media["video"])
    blank = logits(model, inputs["input_ids"], media, position_ids(hf_model.config, inputs))
    assert (right - text).abs().max().item() > 100 * TOLERANCE
    assert (right - blank).abs().max().item() > 100 * TOLERANCE


def test_round_trip_is_bit_identical(converted, gloo_world, tmp_path):
    from megatron_mm.hf.convert import export_hf

    original, _, ckpt = converted
    out = export_hf(ckpt, str(tmp_path / "exported"))
    reloaded, info = type(original).from_pretrained(out, output_loading_info=True,
                                                    dtype=torch.float32)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    want, got = original.state_dict(), reloaded.state_dict()
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert torch.equal(got[key], value), key


@pytest.mark.parametrize("vision,field", [
    (dict(hidden_act="gelu"), "vision_config.hidden_act='gelu'"),
    (dict(in_channels=4), "vision_config.in_channels=4"),
    (dict(out_hidden_size=32), "vision_config.out_hidden_size=32"),
])
def test_unsupported_config_fields_are_refused(vision, field):
    from megatron_mm.hf.families import model_flags

    with pytest.raises(ConversionError, match=field.replace("(", r"\(")):
        model_flags(_config(**vision))
