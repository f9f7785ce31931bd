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
from tiny_qwen3_vl import SEQ, VOCAB, config, inputs, tiny

TOLERANCE = 1e-4


def _config(text=None, **vision):
    return config("Qwen3VL", text, **vision)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from megatron_mm.hf.convert import import_hf
    from megatron_mm.hf.world import single_rank_world

    root = tmp_path_factory.mktemp("qwen3_vl")
    model = tiny(_config())
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
    diff, shape = compare(hf_dir, ckpt, inputs(), tp=tp, pp=pp)
    print(f"qwen3-vl TP={tp} PP={pp}: max abs logit difference {diff:.3g}")
    assert tuple(shape) == (2, SEQ, VOCAB)
    assert diff <= TOLERANCE


def test_positions_and_deepstack_matter(converted, gloo_world):
    """The comparison is sensitive: text positions, or the DeepStack features left out,
    move the logits by far more than the tolerance."""
    from megatron_mm.families.qwen3_vl.hf import megatron_media, position_ids
    from megatron_mm.hf.compare import load_converted, logits

    hf_model, _, ckpt = converted
    batch = inputs()
    model = load_converted(ckpt)
    media = megatron_media(batch)
    positions = position_ids(hf_model.config, batch)
    right = logits(model, batch["input_ids"], media, positions)
    text = logits(model, batch["input_ids"], media)
    model.deepstack.bind(None)
    model.deepstack.bind = lambda features: None  # nothing added inside the LLM
    flat = logits(model, batch["input_ids"], media, positions)
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
