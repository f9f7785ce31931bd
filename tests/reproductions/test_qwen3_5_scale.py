"""Qwen3.5-27B on 16 H100s (``tools/plan.py --qwen35-table``): at long sequences only a
partition that knows the Gated DeltaNet layers are O(S) beats Megatron's uniform one."""

import pytest

from megatron_mm.reproductions.qwen3_5_scale import MICROBATCHES, attention_only, model, rows


def test_hybrid_partition_at_long_context():
    uniform, blind, auto = rows(131072)
    assert (uniform.policy, blind.policy, auto.policy) == (
        "uniform", "auto, attention-only costs", "auto")
    assert uniform.llm_layers_per_stage == [16, 16, 16, 16]
    # all-attention costs are uniform per layer: the ViT's share moves nothing here
    assert blind.iteration_s == pytest.approx(uniform.iteration_s)
    assert auto.llm_layers_per_stage != blind.llm_layers_per_stage
    assert auto.iteration_s < 0.97 * blind.iteration_s
    assert sum(auto.llm_layers_per_stage) == 64
    assert auto.tokens_per_s == pytest.approx(MICROBATCHES * 131072 / auto.iteration_s)


def test_the_attention_only_twin_differs_only_in_its_mixers():
    spec = model()
    twin = attention_only(spec)
    assert sum(spec.llm.linear_attention_freq) == 48 and not twin.llm.linear_attention_freq
    assert twin.encoders == spec.encoders and twin.llm.num_layers == spec.llm.num_layers
    assert not spec.tied_embeddings
