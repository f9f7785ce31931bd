"""Qwen3.5 (Qwen3-VL's tower without DeepStack + the hybrid Gated DeltaNet / gated
attention LLM with partial interleaved M-RoPE) -> megatron_mm: on Qwen3-VL's batch (two
images, a two-frame clip with timestamps) ``compare``'s logits equal transformers' at TP=1,
TP=2 (GDN's heads split), PP=2 cut between a linear and a full-attention layer and, by
``convert_hf.py compare --context-parallel-size 2``, CP=2 (max |diff| <= 1e-4, fp32);
export gives back the same tensors; config fields the model does not reproduce are
refused by name."""

import inspect

import pytest
import torch

from megatron_mm.hf.errors import ConversionError
from tiny_qwen3_5 import SEQ, VOCAB, config, inputs, tiny

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from megatron_mm.hf.convert import import_hf
    from megatron_mm.hf.world import single_rank_world

    root = tmp_path_factory.mktemp("qwen3_5")
    model = tiny(config())
    model.save_pretrained(str(root / "hf"))
    with single_rank_world():
        import_hf(str(root / "hf"), str(root / "ckpt"), tensor_model_parallel_size=2)
    return model, str(root / "hf"), str(root / "ckpt")


@pytest.mark.parametrize("tp,pp", [
    (1, 1), pytest.param(2, 1, marks=pytest.mark.processes),
    # LLM layers 0 (GDN), 1 (full) | 2 (GDN), 3 (full): a cut between a full and a linear
    pytest.param(1, 2, marks=pytest.mark.processes)])
def test_logits_equal_transformers(converted, tp, pp):
    from megatron_mm.hf.compare import compare

    _, hf_dir, ckpt = converted
    diff, shape = compare(hf_dir, ckpt, inputs(), tp=tp, pp=pp)
    print(f"qwen3.5 TP={tp} PP={pp}: max abs logit difference {diff:.3g}")
    assert tuple(shape) == (2, SEQ, VOCAB)
    assert diff <= TOLERANCE


@pytest.mark.processes
def test_compare_context_parallel_equals_transformers(converted, tmp_path, capsys):
    """``convert_hf.py compare --context-parallel-size 2``: each rank its tokens of the
    training script's causal split (blocks of 8: the 56 tokens split 28 / 28 or unevenly),
    the GDN layers head-parallel over the two ranks."""
    import importlib.util
    import os

    spec = importlib.util.spec_from_file_location("convert_hf", os.path.join(
        os.path.dirname(__file__), "..", "..", "..", "tools", "convert_hf.py"))
    convert_hf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(convert_hf)
    _, hf_dir, ckpt = converted
    torch.save(inputs(), str(tmp_path / "inputs.pt"))
    code = convert_hf.main(["compare", "--hf-dir", hf_dir, "--load", ckpt, "--inputs",
                            str(tmp_path / "inputs.pt"), "--context-parallel-size", "2",
                            "--context-parallel-block", "8"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"logits [2, {SEQ}, {VOCAB}], TP=1 PP=1 EP=1 CP=2" in out
    last = out.strip().splitlines()[-1]
    with capsys.disabled():
        print(f"qwen3.5 CP=2: {last}")
    assert float(last.removeprefix("max abs logit difference: ")) <= TOLERANCE


# (the round trips come after every in-process compare: a compare at world 1 tears down
# the Megatron world that gloo_world holds for the module)
@pytest.fixture(scope="module")
def converted_moe(tmp_path_factory):
    from megatron_mm.hf.convert import import_hf
    from megatron_mm.hf.world import single_rank_world

    root = tmp_path_factory.mktemp("qwen3_5_moe")
    model = tiny(config(moe=True))
    model.save_pretrained(str(root / "hf"))
    with single_rank_world():
        import_hf(str(root / "hf"), str(root / "ckpt"))
    return model, str(root / "hf"), str(root / "ckpt")


@pytest.mark.parametrize("tp,pp,ep", [(1, 1, 1),
                                      pytest.param(1, 1, 2, marks=pytest.mark.processes)])
def test_moe_logits_equal_transformers(converted_moe, tp, pp, ep):
    """Qwen3.5-MoE: every layer's routed experts and gated shared expert, at EP=1 and 2."""
    from megatron_mm.hf.compare import compare

    _, hf_dir, ckpt = converted_moe
    diff, shape = compare(hf_dir, ckpt, inputs(), tp=tp, pp=pp, ep=ep)
    print(f"qwen3.5-moe TP={tp} PP={pp} EP={ep}: max abs logit difference {diff:.3g}")
    assert tuple(shape) == (2, SEQ, VOCAB)
    assert diff <= TOLERANCE


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


@pytest.mark.parametrize("text,field", [
    (dict(layer_types=["linear_attention", "sliding_attention", "linear_attention",
                       "full_attention"]), "text_config.layer_types="),
    (dict(linear_num_value_heads=3), "text_config.linear_num_value_heads=3"),
    (dict(attention_bias=True), "text_config.attention_bias=True"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                           "mrope_section": [2, 1, 1], "mrope_interleaved": False,
                           "partial_rotary_factor": 0.25}),
     "text_config.rope_parameters.mrope_interleaved=False"),
])
def test_unsupported_config_fields_are_refused(text, field):
    """One line naming the field a Qwen3.5 checkpoint sets that the package cannot honour."""
    from megatron_mm.hf.families import model_flags

    with pytest.raises(ConversionError, match=field):
        model_flags(config(text))


def test_moe_round_trip_is_bit_identical(converted_moe, gloo_world, tmp_path):
    test_round_trip_is_bit_identical(converted_moe, gloo_world, tmp_path)


def test_moe_without_shared_expert_is_refused():
    from megatron_mm.hf.families import model_flags

    with pytest.raises(ConversionError, match="text_config.shared_expert_intermediate_size=0"):
        model_flags(config(dict(shared_expert_intermediate_size=0), moe=True))


@pytest.mark.parametrize("model_type", ["qwen3_5", "qwen3_5_moe"])
def test_processor_is_qwen3_vls(model_type):
    """transformers processes Qwen3.5's media with Qwen3-VL's processor, image and video
    processors (which tests/families/qwen3_vl compares ours with): the family reuses them,
    and its M-RoPE positions are Qwen3-VL's (get_rope_index splits clips into frames)."""
    from transformers.models.auto import (image_processing_auto, processing_auto,
                                          video_processing_auto)

    assert processing_auto.PROCESSOR_MAPPING_NAMES[model_type] == "Qwen3VLProcessor"
    assert image_processing_auto.IMAGE_PROCESSOR_MAPPING_NAMES[model_type]["pil"] == \
        "Qwen2VLImageProcessorPil"
    # the video table keeps its torchvision entries only where torchvision is installed
    source = inspect.getsource(video_processing_auto)
    assert f'("{model_type}", {{"torchvision": "Qwen3VLVideoProcessor"}})' in source
