"""A partition read as per-chunk modules, and the Megatron-Core layouts built from it."""

import pytest

from megatron_mm.plan import PlanError, StagePartition
from megatron_mm.plan.pipeline.placement import chunk_placements, megatron_layout, whole_model

from helpers import vlm_chain

# llm_embed, vision_embed, 3 ViT layers, projector, 4 LLM layers, llm_head = 11 layers
CHAIN = vlm_chain(3, 4)


def test_whole_model_is_one_chunk_with_everything():
    place = whole_model(CHAIN)
    assert place.llm_embed and place.llm_head and place.runs_llm
    assert place.llm_layers == [0, 4]
    (vit,) = place.encoders
    assert (vit.name, vit.embed, vit.layers, vit.projector) == ("vision", True, [0, 3], True)
    assert place.receives_encoder is None and place.sends_encoder is None


def test_cut_inside_the_encoder_sends_its_hidden_state():
    first, second = chunk_placements(CHAIN, StagePartition(2, 1, [4, 7]))
    assert first.llm_embed and not first.runs_llm
    assert first.encoders[0].layers == [0, 2] and not first.encoders[0].projector
    assert first.sends_encoder == "vision" and second.receives_encoder == "vision"
    vit = second.encoder("vision")
    assert (vit.embed, vit.layers, vit.projector) == (False, [2, 3], True)
    assert second.llm_layers == [0, 4] and second.llm_head and not second.llm_embed


def test_encoder_only_middle_chunks_and_interleaved_layouts():
    # PP=2 x VPP=2: [embed, ViT embed] [ViT 0-2] [projector, LLM 0-1] [LLM 2-3, head]
    places = chunk_placements(CHAIN, StagePartition(2, 2, [2, 3, 3, 3]))
    assert [p.sends_encoder for p in places] == ["vision", "vision", None, None]
    assert not places[1].runs_llm and places[1].encoder("vision").layers == [0, 3]
    assert places[2].encoder("vision").num_layers == 0 and places[2].llm_layers == [0, 2]
    assert megatron_layout(places) == [["embedding"], [], ["decoder"] * 2,
                                       ["decoder"] * 2 + ["loss"]]
    assert megatron_layout(places, "vision") == [["embedding"], ["decoder"] * 3, [],
                                                 ["loss"]]


def test_placements_round_trip_as_data():
    from megatron_mm.plan.pipeline.placement import ChunkPlacement

    for place in chunk_placements(CHAIN, StagePartition(2, 1, [5, 6])):
        assert ChunkPlacement.from_json(place.to_json()) == place


def test_a_partition_of_another_chain_is_refused():
    with pytest.raises(PlanError, match="covers 10 layers but the model's chain has 11"):
        chunk_placements(CHAIN, StagePartition(2, 1, [5, 5]))
