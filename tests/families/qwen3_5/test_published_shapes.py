"""Qwen3.6 and Qwen3.8 load as Qwen3.5 (``Qwen3_5ForConditionalGeneration``,
``Qwen3_5MoeForConditionalGeneration``): small configs of their published shapes, with
every field of the published ``config.json`` (262,144 positions, rope theta 1e7, partial
interleaved M-RoPE, the 3 : 1 layer pattern, the MTP fields) and the MTP head's tensors
in the checkpoint, import, ``compare`` within 1e-4 of transformers' logits, and export
gives back every tensor (the MTP head's too)."""

import pytest
import torch

from published_shapes import CONTEXT, ROPE_THETA, SHAPES, config, mtp_tensors
from tiny_qwen3_5 import SEQ, VOCAB, inputs, tiny

TOLERANCE = 1e-4


@pytest.mark.parametrize("name", list(SHAPES))
def test_flags_of_the_published_shape(name):
    from megatron_mm.hf.families import model_flags

    cfg = config(name)
    flags = model_flags(cfg)
    text = cfg.get_text_config()
    assert flags["max_position_embeddings"] == CONTEXT
    assert flags["rotary_base"] == ROPE_THETA and flags["rotary_percent"] == 0.25
    assert flags["mrope_section"] == [2, 1, 1] and flags["mrope_interleaved"]
    assert flags["linear_attention_freq"] == [1, 1, 1, 0] * (text.num_hidden_layers // 4)
    assert flags["vision_deepstack_visual_indexes"] == []
    assert flags["num_query_groups"] == text.num_key_value_heads
    assert flags["linear_num_value_heads"] == text.linear_num_value_heads
    if "Moe" in cfg.architectures[0]:
        assert flags["moe_shared_expert_intermediate_size"] == flags["moe_ffn_hidden_size"]


@pytest.fixture(scope="module", params=list(SHAPES))
def converted(request, tmp_path_factory):
    """A shape's model saved with the MTP head's tensors added, and its conversion."""
    from safetensors.torch import load_file, save_file

    from megatron_mm.hf.convert import import_hf
    from megatron_mm.hf.world import single_rank_world

    root = tmp_path_factory.mktemp(request.param)
    cfg = config(request.param)
    hf_dir, ckpt = str(root / "hf"), str(root / "ckpt")
    tiny(cfg).save_pretrained(hf_dir)
    saved = {**load_file(f"{hf_dir}/model.safetensors"), **mtp_tensors(cfg)}
    save_file(saved, f"{hf_dir}/model.safetensors", metadata={"format": "pt"})
    with single_rank_world():
        import_hf(hf_dir, ckpt)
    return request.param, hf_dir, ckpt, saved


@pytest.mark.slow
def test_published_shape_compares_and_exports(converted, tmp_path):
    from megatron_mm.hf.compare import compare
    from megatron_mm.hf.convert import export_hf
    from megatron_mm.hf.safetensors_io import read_weights
    from megatron_mm.hf.world import single_rank_world

    name, hf_dir, ckpt, saved = converted
    diff, shape = compare(hf_dir, ckpt, inputs())
    print(f"{name}: max abs logit difference {diff:.3g}")
    assert tuple(shape) == (2, SEQ, VOCAB)
    assert diff <= TOLERANCE
    with single_rank_world():  # (compare's world is gone)
        got = read_weights(export_hf(ckpt, str(tmp_path / "exported")))
    assert got.keys() == saved.keys()
    for key, value in saved.items():
        assert torch.equal(got[key], value), key
