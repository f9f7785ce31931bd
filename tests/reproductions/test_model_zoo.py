"""Zoo sizes against the published parameter counts, and media-token counts."""

import pytest

from megatron_mm.plan import Workload, build_chain
from megatron_mm.reproductions import model_zoo as zoo
from megatron_mm.plan.model import ModelSpec


def total_params(spec):
    model = ModelSpec(name="x", encoders=[spec] if not hasattr(spec, "vocab_size") else [],
                      llm=spec if hasattr(spec, "vocab_size") else zoo.LLMS["gpt-11b"])
    chain = build_chain(model, Workload(seq_length=model.media_tokens_per_sample + 8))
    is_llm = hasattr(spec, "vocab_size")
    return sum(l.params for l in chain
               if (l.branch == "llm") == is_llm and l.kind != "projector")


@pytest.mark.parametrize("name,published", [
    ("llama-3.1-8b", 8.03e9), ("llama-3.1-70b", 70.6e9), ("qwen2.5-72b", 72.7e9),
    ("qwen2.5-14b", 14.7e9), ("mixtral-8x7b", 46.7e9),
    ("gemma-2-27b", 27.2e9 + 256000 * 4608),  # tied: a pipeline keeps a second copy
    ("mistral-7b-v0.3", 7.25e9), ("gpt-175b", 175e9),
    ("qwen3.5-27b", 27e9),  # the hybrid: 48 Gated DeltaNet + 16 gated attention layers
])
def test_llm_parameter_counts(name, published):
    assert total_params(zoo.LLMS[name]) == pytest.approx(published, rel=0.02)


@pytest.mark.parametrize("name,published", [
    ("vit-22b", 21.7e9), ("whisper-large-v3", 0.635e9), ("whisper-medium", 0.307e9),
    ("siglip-so400m-14-384", 0.428e9), ("qwen2-vl-vision-675m", 0.63e9),
])
def test_encoder_parameter_counts(name, published):
    # published SigLIP counts include its pooling head; Qwen2-VL's 675M its merger (45M)
    spec = (zoo.vision_encoder(name) if name in zoo.VISION else zoo.audio_encoder(name))
    assert total_params(spec) == pytest.approx(published, rel=0.05)


def test_media_tokens_follow_the_harness():
    vit = zoo.vision_encoder("vit-22b")  # 1280x720 in 448 px tiles: 3 x 2, 32^2 + cls
    assert (vit.items_per_sample, vit.tokens_per_item, vit.llm_tokens_per_item) == (6, 1025, 1025)
    siglip = zoo.vision_encoder("siglip-so400m-14-384")  # 4 x 2 tiles of 27^2, no cls
    assert (siglip.items_per_sample, siglip.tokens_per_item) == (8, 729)
    pixtral = zoo.vision_encoder("pixtral-400m")  # 1024x576 at 16 px
    assert (pixtral.items_per_sample, pixtral.tokens_per_item) == (1, 64 * 36)
    qwen = zoo.vision_encoder("qwen2-vl-vision-675m")  # 1288x728 at 14 px, 2x2 merge
    assert (qwen.tokens_per_item, qwen.llm_tokens_per_item) == (92 * 52, 92 * 52 // 4)
    assert qwen.projector_input_size == 4 * 1280
    qwen35 = zoo.vision_encoder("qwen3.5-vision")  # 1280x704 at 16 px, 2x2 merge
    assert (qwen35.tokens_per_item, qwen35.llm_tokens_per_item) == (80 * 44, 80 * 44 // 4)
    assert zoo.audio_encoder("qwen2-audio-encoder").llm_tokens_per_item == 750
    assert zoo.audio_encoder("whisper-small", seconds=45).items_per_sample == 2
    model = zoo.model_pair("VALM-S")
    assert model.media_tokens_per_sample == 8 * 729 + 1500
    assert [e.modality for e in model.encoders] == ["vision", "audio"]


def test_every_pair_builds_a_chain():
    for name in zoo.PAIRS:
        model = zoo.model_pair(name).with_freeze(True, False, True)
        chain = build_chain(model, Workload(seq_length=model.media_tokens_per_sample + 64))
        assert chain[-1].kind == "llm_head" and all(l.fwd_flops >= 0 for l in chain)
