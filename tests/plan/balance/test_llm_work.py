"""The balancer's LLM work from the model (LLMWork): linear in the tokens for Gated
DeltaNet layers, quadratic for full attention; the LLM imbalance it gives by hand."""

import dataclasses

import pytest

from megatron_mm.plan.balance import LLMWork, SampleLoad, measure
from megatron_mm.plan.costs import flops
from megatron_mm.plan.model import LinearAttentionSpec, TransformerSpec, linear_attention_pattern

LA = LinearAttentionSpec(linear_key_head_dim=16, linear_value_head_dim=16,
                         linear_num_key_heads=2, linear_num_value_heads=4, chunk_size=16)
HYBRID = TransformerSpec(hidden_size=64, num_layers=8, ffn_hidden_size=128,
                         num_attention_heads=4, gated_linear_unit=True, vocab_size=256,
                         linear_attention=LA, linear_attention_freq=linear_attention_pattern(4, 8))


def test_work_is_the_layers_flops():
    work = LLMWork(HYBRID)
    assert work(96) == sum(flops.llm_layer(HYBRID, i, 1, 96).fwd for i in range(8))


def test_linear_layers_grow_linearly_in_the_sequence():
    linear_only = dataclasses.replace(HYBRID, linear_attention_freq=[1] * 8)
    full = dataclasses.replace(HYBRID, linear_attention=None, linear_attention_freq=[])
    lin, hyb, att = LLMWork(linear_only), LLMWork(HYBRID), LLMWork(full)
    for s in (64, 512, 4096):  # whole chunks
        assert lin(2 * s) == 2 * lin(s)
        # the hybrid's growth beyond linear is its two attention layers' pairs alone
        extra = hyb(2 * s) - 2 * hyb(s)
        assert extra == pytest.approx(2 * 4 * (4 * s * s - 2 * s * s) * 64 * 0.5)
        assert att(2 * s) - 2 * att(s) == pytest.approx(4 * extra)  # 8 attention layers


def test_llm_imbalance_by_work():
    loads = [SampleLoad(0, 1024), SampleLoad(0, 1024), SampleLoad(0, 2048)]
    steps = [[[0, 1], [2]]]  # 2048 tokens on each rank: balanced by tokens
    assert measure(steps, loads, packed=True).llm_imbalance == 0
    work = LLMWork(dataclasses.replace(HYBRID, linear_attention=None, linear_attention_freq=[]))
    heavy, light = work(2048), 2 * work(1024)  # one long sample costs more than two short
    assert measure(steps, loads, packed=True, llm_work=work).llm_imbalance == pytest.approx(
        (heavy - light) / (heavy * 2))
    # all Gated DeltaNet: the work is proportional to the tokens again
    linear = LLMWork(dataclasses.replace(HYBRID, linear_attention_freq=[1] * 8))
    assert measure(steps, loads, packed=True, llm_work=linear).llm_imbalance == 0
