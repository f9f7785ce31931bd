"""A hybrid LLM (Gated DeltaNet layers, every 4th full attention) in the partition, the
placement, the memory model and the encoder schedules' action costs: each layer weighs
by its own kind."""

import dataclasses

import pytest

from megatron_mm.plan import Workload, build_chain
from megatron_mm.plan.costs import flops
from megatron_mm.plan.costs.hardware import H100, H100_LINKS, MemoryModel
from megatron_mm.plan.model import (EncoderSpec, LinearAttentionSpec, ModelSpec,
                                    TransformerSpec, linear_attention_pattern)
from megatron_mm.plan.pipeline.inflight import inflight_microbatches
from megatron_mm.plan.pipeline.memory import ChunkMemory
from megatron_mm.plan.pipeline.partition import partition
from megatron_mm.plan.pipeline.placement import chunk_placements
from megatron_mm.plan.schedules.action_costs import CostModel, LLMLayout

LA = LinearAttentionSpec(linear_key_head_dim=32, linear_value_head_dim=32,
                         linear_num_key_heads=4, linear_num_value_heads=8)
HYBRID = TransformerSpec(hidden_size=256, num_layers=12, ffn_hidden_size=768,
                         num_attention_heads=8, num_query_groups=2, gated_linear_unit=True,
                         vocab_size=1024, linear_attention=LA,
                         linear_attention_freq=linear_attention_pattern(4, 12))
FULL = dataclasses.replace(HYBRID, linear_attention=None, linear_attention_freq=[])


def chain_of(llm, seq=8192, encoders=()):
    return build_chain(ModelSpec("m", list(encoders), llm), Workload(seq_length=seq))


def bottleneck(chain, part):
    return max(sum(l.total_flops for l in chain[s:e]) for s, e in part.chunk_bounds())


def test_partition_changes_because_of_linear_attention():
    hybrid, full = chain_of(HYBRID), chain_of(FULL)
    # full attention (layers 3, 7, 11) is the heavy layer at 8K tokens, not Gated DeltaNet
    kinds = [l.total_flops for l in hybrid[1:-1]]
    assert kinds[3] > 2 * kinds[0] and kinds[0] == kinds[4] and kinds[3] == kinds[7]
    assert len({l.total_flops for l in full[1:-1]}) == 1  # all-attention: uniform layers
    ours, blind = partition(hybrid, 2, 1, "auto"), partition(full, 2, 1, "auto")
    assert ours.layers_per_chunk != blind.layers_per_chunk
    # the all-attention model's cut, run on the hybrid, leaves a slower bottleneck stage
    blind_on_hybrid = partition(hybrid, 2, 1, blind.layers_per_chunk)
    assert bottleneck(hybrid, ours) < bottleneck(hybrid, blind_on_hybrid)
    # ... the best there is: no other cut of the hybrid does better
    best = min(bottleneck(hybrid, partition(hybrid, 2, 1, [k, len(hybrid) - k]))
               for k in range(1, len(hybrid)))
    assert bottleneck(hybrid, ours) == best


def test_a_cut_inside_the_layer_pattern_keeps_each_layer_its_kind():
    chain = chain_of(HYBRID)
    part = partition(chain, 2, 1, "auto")
    first, second = chunk_placements(chain, part)
    cut = first.llm_layers[1]
    assert second.llm_layers == [cut, 12] and cut % 4 != 0  # mid-group (3 linear + 1 full)
    for i, layer in enumerate(l for l in chain if l.kind == "llm_layer"):  # global index
        assert layer.module == f"language_model.decoder.layers.{i}"
        assert layer.fwd_flops == flops.llm_layer(HYBRID, i, 1, 8192).fwd


def test_memory_model_sums_each_layer_kind():
    chain = chain_of(HYBRID, seq=1024)
    mem = ChunkMemory(chain, 2, 1, 4, MemoryModel())
    gdn, attn = (flops.llm_layer(HYBRID, i, 1, 1024).act for i in (0, 3))
    assert gdn != attn
    # chunk 0 = embed + layers 0-4 (four Gated DeltaNet, one attention), 2 micro-batches
    # in flight on rank 0 of 2 with 4 micro-batches
    assert mem.activation_bytes(0, 6, 0) == mem.inflight_of_chunk(0) * (4 * gdn + attn)
    assert mem.inflight_of_chunk(0) == 2


def test_action_costs_weigh_chunks_by_their_layers():
    vit = TransformerSpec(hidden_size=64, num_layers=2, ffn_hidden_size=128,
                          num_attention_heads=2, add_bias_linear=True)
    enc = EncoderSpec(name="vision", modality="vision", transformer=vit, tokens_per_item=64,
                      llm_tokens_per_item=16)
    layout = LLMLayout(pipeline_model_parallel_size=2, tensor_model_parallel_size=1,
                       data_parallel_size=1, virtual_pipeline_model_parallel_size=2,
                       global_batch_size=4, seq_length=8192, recompute=False)
    costs = {name: CostModel(ModelSpec(name, [enc], llm), layout, H100, H100_LINKS)
             for name, llm in (("hybrid", HYBRID), ("full", FULL))}
    fwd, _ = costs["hybrid"].llm_chunks([(0, 3), (3, 6), (6, 9), (9, 12)])
    per_layer = [costs["hybrid"].time.compute_s(flops.llm_layer(HYBRID, i, 1, 8192).fwd)
                 for i in range(12)]
    assert fwd[:3] == pytest.approx([sum(per_layer[0:3]), sum(per_layer[3:6]),
                                     sum(per_layer[6:9])])
    assert fwd[1] > fwd[0]  # it holds full-attention layer 3
    # the memory estimate keeps each chunk's own layers' activations (chunk_spans: Megatron's
    # uniform 3 layers per chunk), the fullest chunk's, plus one layer's working set
    held = sum(inflight_microbatches(2, 2, 0, 4))

    def llm_bytes(cm, llm):
        acts = [flops.llm_layer(llm, i, 1, 8192).act for i in range(12)]
        chunk = max(sum(acts[s:e]) for s, e in cm.chunk_spans)
        return cm.llm_params_per_gpu() * (6 + 12) + held * chunk + max(acts)

    h, f = costs["hybrid"], costs["full"]
    assert h.memory_bytes(None) - f.memory_bytes(None) == pytest.approx(
        llm_bytes(h, HYBRID) - llm_bytes(f, FULL))


def test_adaptive_recompute_frees_each_layers_own_bytes():
    """OmniBal's chooser recomputes the first N LLM layers of a chunk: on a hybrid the
    bytes it frees are those layers' own (three Gated DeltaNet layers, then attention)."""
    from megatron_mm.plan.pipeline.recompute_budget import chunk_activations

    chain = chain_of(HYBRID, seq=1024)
    (chunk,) = chunk_activations(chain, [[0, len(chain)]], 1, 1, 1)
    kept = [flops.llm_layer(HYBRID, i, 1, 1024) for i in range(12)]
    assert [l.act_bytes for l in chunk.layers] == [c.act for c in kept]
    full = chunk.bytes_with(0)
    for n in (3, 4):  # recomputing layer 3 (attention) frees its bytes, not a DeltaNet's
        freed = sum(c.act - c.recompute_act for c in kept[:n])
        peak = max(c.act for c in kept[:n])  # the layer being recomputed lives again
        assert chunk.bytes_with(n) == pytest.approx(full - freed + peak)
