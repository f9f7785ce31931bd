"""Qwen3-VL (frame-attention ViT with a learned position table and DeepStack mergers +
Qwen3 with interleaved M-RoPE) -> megatron_mm: on a batch with two images of different
sizes and a two-frame video (timestamp text between its frames, as the processor writes
it), ``compare``'s logits equal transformers' at TP=1, TP=2 and PP=2 with the cut between
two DeepStack layers (max |diff| <= 1e-4, fp32), DeepStack from tower layers that are not
the last; export gives back the same
tensors; config fields the model does not reproduce are refused."""

import pytest
import torch

from megatron_mm.hf.errors import ConversionError

VOCAB, IMAGE, VIDEO, START, END = 250, 247, 248, 245, 246
TOLERANCE = 1e-4
SEQ = 56
PATCH = 16
GRIDS = {"image": [(1, 8, 12), (1, 4, 4)], "video": [(2, 4, 8)]}  # 24, 4 and 2 x 8 tokens


def _config(text=None, **vision):
    from transformers import Qwen3VLConfig

    config = Qwen3VLConfig(
        text_config={**dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5,
                            rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                             "mrope_section": [2, 3, 3],
                                             "mrope_interleaved": True}),
                     **(text or {})},
        vision_config={**dict(depth=4, hidden_size=32, intermediate_size=64, num_heads=4,
                              out_hidden_size=64, patch_size=PATCH, num_position_embeddings=16,
                              deepstack_visual_indexes=[0, 1, 2]), **vision},
        image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START,
        vision_end_token_id=END, tie_word_embeddings=False)
    config.architectures = ["Qwen3VLForConditionalGeneration"]
    return config


def _tiny():
    import transformers

    torch.manual_seed(0)
    model = transformers.Qwen3VLForConditionalGeneration(_config()).eval()
    with torch.no_grad():  # random norms and biases: a mapping mix-up cannot hide
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
            if "language_model" in n and ("q_proj" in n or "k_proj" in n):
                p.mul_(4.0)  # sharp attention: the 3-D positions show in the logits
            if "deepstack_merger_list" in n and "linear_fc2" in n:
                p.mul_(4.0)  # DeepStack features large enough to show
    return model


def _inputs():
    """Row 0: image 0, then the video's two frames, each after its timestamp text and
    between vision tags; row 1: image 1 (every row unpadded, length SEQ)."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(2, 240, (2, SEQ), generator=gen)
    ids[0, 2], ids[0, 3:27], ids[0, 27] = START, IMAGE, END
    ids[0, 30], ids[0, 31:39], ids[0, 39] = START, VIDEO, END
    ids[0, 42], ids[0, 43:51], ids[0, 51] = START, VIDEO, END
    ids[1, 5], ids[1, 6:10], ids[1, 10] = START, IMAGE, END
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    for kind, rows, grid in (("image", "pixel_values", "image_grid_thw"),
                             ("video", "pixel_values_videos", "video_grid_thw")):
        patches = sum(t * h * w for t, h, w in GRIDS[kind])
        inputs[rows] = torch.randn(patches, 3 * 2 * PATCH * PATCH, generator=gen)
        inputs[grid] = torch.tensor(GRIDS[kind])
    return inputs


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from megatron_mm.hf.convert import import_hf
    from megatron_mm.hf.world import single_rank_world

    root = tmp_path_factory.mktemp("qwen3_vl")
    model = _tiny()
    model.save_pretrained(str(root / "hf"))
    with single_rank_world():
        import_hf(str(root / "hf"), str(root / "ckpt"), tensor_model_parallel_size=2)
    return model, str(root / "hf"), str(root / "ckpt")


@pytest.mark.parametrize("tp,pp", [(1, 1), pytest.param(2, 1, marks=pytest.mark.processes),
                                   # LLM layers 0, 1 | 2, 3: the DeepStack feature of
                                   # layer 2 crosses the cut with the hidden state
                                   pytest.param(1, 2, marks=pytest.mark.processes)])
def test_logits_equal_transformers(converted, tp, pp):
    from megatron_mm.hf.compare import compare

    _, hf_dir, ckpt = converted
    diff, shape = compare(hf_dir, ckpt, _inputs(), tp=tp, pp=pp)
    print(f"qwen3-vl TP={tp} PP={pp}: max abs logit difference {diff:.3g}")
    assert tuple(shape) == (2, SEQ, VOCAB)
    assert diff <= TOLERANCE


def test_positions_and_deepstack_matter(converted, gloo_world):
    """The comparison is sensitive: text positions, or the DeepStack features left out,
    move the logits by far more than the tolerance."""
    from megatron_mm.families.qwen3_vl.hf import megatron_media, position_ids
    from megatron_mm.hf.compare import load_converted, logits

    hf_model, _, ckpt = converted
    inputs = _inputs()
    model = load_converted(ckpt)
    media = megatron_media(inputs)
    positions = position_ids(hf_model.config, inputs)
    right = logits(model, inputs["input_ids"], media, positions)
    text = logits(model, inputs["input_ids"], media)
    model.deepstack.bind(None)
    model.deepstack.bind = lambda features: None  # nothing added inside the LLM
    flat = logits(model, inputs["input_ids"], media, positions)
    assert (right - text).abs().max().item() > 100 * TOLERANCE
    assert (right - flat).abs().max().item() > 100 * TOLERANCE


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


@pytest.mark.parametrize("text,vision,field", [
    ({}, dict(hidden_act="gelu"), "vision_config.hidden_act='gelu'"),
    ({}, dict(in_channels=4), "vision_config.in_channels=4"),
    ({}, dict(num_position_embeddings=20), "vision_config.num_position_embeddings=20"),
    ({}, dict(out_hidden_size=32), "vision_config.out_hidden_size=32"),
    ({}, dict(deepstack_visual_indexes=[0, 1, 2, 0, 1]),
     r"vision_config.deepstack_visual_indexes=\[0, 1, 2, 0, 1\]"),
    (dict(attention_bias=True), {}, "text_config.attention_bias=True"),
    (dict(hidden_act="gelu"), {}, "text_config.hidden_act='gelu'"),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0,
                           "mrope_section": [2, 3, 3]}), {},
     "text_config.rope_parameters.rope_type='yarn'"),
])
def test_unsupported_config_fields_are_refused(text, vision, field):
    from megatron_mm.hf.families import model_flags

    with pytest.raises(ConversionError, match=field):
        model_flags(_config(text, **vision))
