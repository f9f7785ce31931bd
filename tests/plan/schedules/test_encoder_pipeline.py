"""Each encoder as its own pipeline: pieces, where each runs, the chunks' modules, and the
per-action costs the bubble schedule and the simulator use; vision and audio together."""

import pytest

from megatron_mm.plan import PlanError, StagePartition
from megatron_mm.plan.schedules.encoder_pipeline import (schedule_costs, encoder_pieces,
                                                         encoder_replica_of, plan_encoder_pipeline,
                                                         separate_placements)
from megatron_mm.plan.costs.hardware import Hardware
from megatron_mm.plan.pipeline.placement import megatron_layout

from helpers import layer, vlm_chain

UNIT = Hardware(name="1 FLOP per second", peak_flops=1.0, efficiency=1.0)


def test_pieces_cut_the_encoder_layers_evenly_in_pipeline_order():
    pieces = encoder_pieces(vlm_chain(5, 4), [0, 0, 1])
    assert pieces.name == "vision" and pieces.layers == [[0, 2], [2, 4], [4, 5]]
    assert pieces.of_rank(0) == [0, 1]
    with pytest.raises(PlanError, match="--encoder-pieces"):
        encoder_pieces(vlm_chain(2, 4), [0, 0, 1])
    # placed from the last rank: rank 1 holds the first layers
    assert encoder_pieces(vlm_chain(5, 4), [1, 1, 0]).layers == [[0, 2], [2, 4], [4, 5]]
    with pytest.raises(PlanError, match="non-decreasing or non-increasing"):
        encoder_pieces(vlm_chain(4, 4), [1, 0, 1])


def test_auto_gives_the_encoder_to_the_less_loaded_ranks():
    # 6 ViT layers (3 units each, trainable) over 2 ranks; LLM: 2 layers, embed and head
    chain = vlm_chain(6, 2, freeze_vit=False, freeze_llm=False)
    even = plan_encoder_pipeline(chain, 2, 1, "uniform")
    assert even.pieces[0].layers == [[0, 3], [3, 6]]
    # LLM chunk 0 = embed + LLM 0 + projector: 9, chunk 1 = LLM 1 + head: 6; ViT embed on
    # rank 0: 3 -> rank 0 takes 2 ViT layers (12 + 6 = 18), rank 1 four (6 + 12 = 18)
    auto = plan_encoder_pipeline(chain, 2, 1, "auto", hardware=UNIT)
    assert auto.pieces[0].layers == [[0, 2], [2, 6]]
    two = plan_encoder_pipeline(chain, 2, 1, "auto", pieces_per_stage=2, hardware=UNIT)
    assert two.pieces[0].layers == [[0, 1], [1, 2], [2, 4], [4, 6]]


def test_placements_put_pieces_in_first_chunks_and_the_projector_in_chunk_0():
    chain = vlm_chain(4, 4)
    # LLM chain: embed, 4 layers, head over PP=2 x VPP=2 chunks
    llm = StagePartition(2, 2, [2, 1, 1, 2])
    places = separate_placements(chain, llm, [encoder_pieces(chain, [0, 1])])
    assert all(p.encoder_separate for p in places)
    vit0, vit1 = places[0].encoder("vision"), places[1].encoder("vision")
    assert (vit0.embed, vit0.layers, vit0.projector) == (True, [0, 2], True)
    assert (vit1.embed, vit1.layers, vit1.projector) == (False, [2, 4], False)
    assert places[2].encoder("vision") is None and places[3].encoder("vision") is None
    assert places[0].llm_embed and places[0].llm_layers == [0, 1] and places[3].llm_head
    # Megatron-Core numbers the ViT layers in pipeline order: 2 on rank 0, 2 on rank 1
    assert megatron_layout(places, "vision") == [["embedding", "decoder", "decoder"],
                                                 ["decoder", "decoder"], [], ["loss"]]


def test_schedule_costs_sum_their_layers():
    chain = vlm_chain(4, 2, freeze_vit=False, freeze_llm=False)
    plan = plan_encoder_pipeline(chain, 2, 1, "uniform")
    costs = schedule_costs(chain, plan.llm_partition, plan.pieces, UNIT)
    # unit forward per layer: chunk 0 = embed + LLM 0 + projector, chunk 1 = LLM 1 + head;
    # piece 0 = ViT 0-1 + patch embedding, piece 1 = ViT 2-3
    assert plan.llm_partition.layers_per_chunk == [2, 2]
    assert costs.forward_s == [3.0, 2.0] and costs.encoder_forward_s == [3.0, 2.0]
    assert plan.encoder_trainable
    assert not plan_encoder_pipeline(vlm_chain(4, 2), 2, 1, "uniform").encoder_trainable


def _vision_audio_chain(n_audio=2):
    """llm_embed, vision embed, 2 ViT layers, projector, audio embed, ``n_audio`` audio
    layers, audio projector, 2 LLM layers, head; everything trainable."""
    chain = vlm_chain(2, 2, freeze_vit=False, freeze_llm=False)
    audio = ([layer("audio_embed", branch="audio")]
             + [layer("audio_layer", i, branch="audio") for i in range(n_audio)]
             + [layer("projector", branch="audio")])
    return chain[:5] + audio + chain[5:]


def test_vision_and_audio_each_get_their_own_pieces_over_the_same_ranks():
    chain = _vision_audio_chain(n_audio=4)
    plan = plan_encoder_pipeline(chain, 2, 1, "uniform")
    assert [(p.name, p.layers, p.ranks) for p in plan.pieces] == [
        ("vision", [[0, 1], [1, 2]], [0, 1]), ("audio", [[0, 2], [2, 4]], [0, 1])]
    assert plan.trainable == [True, True] and plan.frozen_encoders == []
    places = plan.placements
    for name, layers in (("vision", ([0, 1], [1, 2])), ("audio", ([0, 2], [2, 4]))):
        first, second = places[0].encoder(name), places[1].encoder(name)
        assert (first.embed, first.layers, first.projector) == (True, layers[0], True)
        assert (second.embed, second.layers, second.projector) == (False, layers[1], False)
    # pieces numbered vision then audio; each piece 0 with its embedding, chunk 0 with both
    # projectors (unit forward per layer)
    costs = schedule_costs(chain, plan.llm_partition, plan.pieces, UNIT)
    assert costs.encoder_forward_s == [2.0, 1.0, 3.0, 2.0]
    assert costs.forward_s == [4.0, 2.0]  # embed + LLM 0 + 2 projectors | LLM 1 + head
    # balanced: each encoder placed against the LLM and the encoders before it
    auto = plan_encoder_pipeline(chain, 2, 1, "auto", hardware=UNIT)
    assert [p.layers for p in auto.pieces] == [[[0, 1], [1, 2]], [[0, 1], [1, 4]]]


def test_a_frozen_encoder_beside_a_trainable_one():
    chain = _vision_audio_chain()
    for l in chain:
        if l.branch == "vision" and l.kind != "projector":
            l.trainable = False
    plan = plan_encoder_pipeline(chain, 2, 1, "uniform")
    assert plan.trainable == [False, True] and plan.encoder_trainable
    assert plan.frozen_encoders == [0]


def test_an_encoder_shorter_than_its_pieces_is_named():
    with pytest.raises(PlanError, match="pieces of encoder 'audio' but it has 1 layers"):
        plan_encoder_pipeline(_vision_audio_chain(n_audio=1), 2, 1, "uniform")
    with pytest.raises(PlanError, match="this model has none"):
        plan_encoder_pipeline([l for l in vlm_chain(2, 2) if l.branch == "llm"], 2, 1,
                              "uniform")


def test_encoder_replicas_own_micro_batches_round_robin():
    assert [encoder_replica_of(m, 2) for m in range(5)] == [0, 1, 0, 1, 0]
    assert [encoder_replica_of(m, 1) for m in range(3)] == [0, 0, 0]
    # every micro-batch has exactly one owner, and the shares differ by at most one
    for replicas in (1, 2, 3, 4):
        for n in range(1, 9):
            owned = [sum(encoder_replica_of(m, replicas) == j for m in range(n))
                     for j in range(replicas)]
            assert sum(owned) == n and max(owned) - min(owned) <= 1
    with pytest.raises(PlanError, match="encoder replicas must be >= 1"):
        encoder_replica_of(0, 0)


def test_an_encoder_placed_from_the_last_rank_is_laid_out_over_mirrored_ranks():
    from megatron_mm.plan.pipeline.placement import stack_layout

    chain = vlm_chain(5, 4)
    first = plan_encoder_pipeline(chain, 2, 1, "auto", 2, 1)
    assert stack_layout(first.placements, 2, "vision") == (
        megatron_layout(first.placements, "vision"), False)
    last = plan_encoder_pipeline(chain, 2, 1, "auto", 2, 1, reverse=True)
    assert last.pieces[0].ranks == [1, 0] and last.reverse
    rank1, rank0 = (last.placements[r].encoder("vision").num_layers for r in (1, 0))
    assert last.placements[1].encoder("vision").layers[0] == 0  # rank 1: the first layers
    # position PP - 1 - r holds rank r's layers: rank 1's come first, as numbered
    layout, mirrored = stack_layout(last.placements, 2, "vision")
    assert mirrored and layout == [["embedding"] + ["decoder"] * rank1,
                                   ["decoder"] * rank0 + ["loss"]]


def test_an_interleaved_encoder_runs_its_rounds_over_the_stages():
    from megatron_mm.plan.schedules.generate import encoder_placement

    assert encoder_placement(2, 2, 1, False, 2) == (2, [0, 1, 0, 1])
    assert encoder_placement(2, 2, 1, True, 2) == (2, [1, 0, 1, 0])
    assert encoder_placement(2, 2, 2, False, 2)[1] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert encoder_placement(4, 2, 1, False, 3)[1] == [0, 2] * 3
    with pytest.raises(PlanError, match="--encoder-virtual-pipeline-model-parallel-size "
                                        r"\(2\) needs an encoder pipeline of at least 2"):
        encoder_placement(2, 1, 1, False, 2)
    with pytest.raises(PlanError, match="must be at least 1"):
        encoder_placement(2, 2, 1, False, 0)
    # even cuts: one range per rank and round; pieces cut each range
    chain = vlm_chain(6, 4)
    assert encoder_pieces(chain, [0, 1, 0, 1]).layers == [[0, 2], [2, 4], [4, 5], [5, 6]]
    assert encoder_pieces(chain, [1, 0, 1, 0], segments=[1, 2, 2, 1]).layers == [
        [0, 1], [1, 3], [3, 5], [5, 6]]
    with pytest.raises(PlanError, match=r"segment sizes \[1, 1, 1, 1\] do not cut its 6"):
        encoder_pieces(chain, [0, 1, 0, 1], segments=[1, 1, 1, 1])
    with pytest.raises(PlanError, match="as many pieces per rank each round"):
        encoder_pieces(chain, [0, 0, 1, 0, 1])
    with pytest.raises(PlanError, match="--encoder-virtual-pipeline-model-parallel-size"):
        encoder_pieces(vlm_chain(3, 4), [0, 1, 0, 1])


def test_an_interleaved_encoder_balances_each_rank_then_cuts_its_rounds():
    # as test_auto_gives_the_encoder_to_the_less_loaded_ranks: rank 0 takes 2 ViT layers,
    # rank 1 four; two rounds split each rank's share evenly
    chain = vlm_chain(6, 2, freeze_vit=False, freeze_llm=False)
    plan = plan_encoder_pipeline(chain, 2, 1, "auto", hardware=UNIT, virtual=2)
    assert plan.pieces[0].ranks == [0, 1, 0, 1]
    assert plan.pieces[0].layers == [[0, 1], [1, 3], [3, 4], [4, 6]]
    # each rank's first chunk holds one range per round; the embedding with layer 0
    vit0, vit1 = (plan.placements[r].encoder("vision") for r in (0, 1))
    assert (vit0.embed, vit0.layers, vit0.interleaved, vit0.projector) == (
        True, [0, 1], [[3, 4]], True)
    assert (vit1.embed, vit1.layers, vit1.interleaved) == (False, [1, 3], [[4, 6]])
    assert (vit0.num_layers, vit1.num_layers) == (2, 4)
    shifted = plan_encoder_pipeline(chain, 2, 1, "auto", hardware=UNIT, virtual=2,
                                    shift=(1, 0, 1))
    assert shifted.pieces[0].layers == [[0, 2], [2, 3], [3, 5], [5, 6]]


def test_an_interleaved_encoder_is_laid_out_round_by_round():
    from megatron_mm.plan.pipeline.placement import stack_layout

    chain = vlm_chain(6, 4)
    first = plan_encoder_pipeline(chain, 2, 1, "uniform", 2, 1, virtual=2)
    # Megatron-Core's interleaved layout: [round 0: rank 0, rank 1, round 1: rank 0, rank 1]
    assert stack_layout(first.placements, 2, "vision") == ([
        ["embedding", "decoder", "decoder"], ["decoder", "decoder"], ["decoder"],
        ["decoder", "loss"]], False)
    last = plan_encoder_pipeline(chain, 2, 1, "uniform", 2, 1, reverse=True, virtual=2)
    assert last.pieces[0].ranks == [1, 0, 1, 0]
    # mirrored: position PP - 1 - r of each round holds rank r's range of that round
    assert stack_layout(last.placements, 2, "vision") == ([
        ["embedding", "decoder", "decoder"], ["decoder", "decoder"], ["decoder"],
        ["decoder", "loss"]], True)
    # a range out of the rounds' order cannot be numbered by Megatron-Core's layout
    last.placements[0].encoder("vision").interleaved, last.placements[0].encoder(
        "vision").layers = [[0, 1]], [5, 6]
    with pytest.raises(PlanError, match="the same each round"):
        stack_layout(last.placements, 2, "vision")


def test_the_segment_search_tries_every_cut_where_they_are_few():
    from megatron_mm.plan.schedules.encoder_pipeline import SEGMENT_CUTS, segment_cuts

    cuts = segment_cuts(6, 4, 1)
    assert len(cuts) == 10 and len(set(cuts)) == 10  # C(5, 3)
    assert all(sum(c) == 6 and min(c) >= 1 for c in cuts)
    assert (3, 1, 1, 1) in cuts and (1, 1, 1, 3) in cuts
    assert segment_cuts(8, 4, 2) == [(2, 2, 2, 2)]
    assert segment_cuts(3, 4, 1) == []  # too few layers
    assert segment_cuts(40, 8, 1) == [] and len(segment_cuts(12, 4, 1)) <= SEGMENT_CUTS
