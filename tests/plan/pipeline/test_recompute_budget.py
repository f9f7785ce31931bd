"""Adaptive recompute: per rank, the block N of each stack that fits the memory budget at
the least recompute cost (OmniBal's knapsack)."""

import itertools
import random

import pytest

from megatron_mm.plan import MemoryModel, PlanError
from megatron_mm.plan.pipeline.recompute_budget import (ChunkActivations, LayerActivation,
                                                        choose_recompute, chunk_activations,
                                                        static_bytes)

from helpers import vlm_chain


def _chunk(rank, inflight, n_llm, n_vis=0, other=0.0):
    layers = [LayerActivation("vision", 10.0, 1.0, 1.0) for _ in range(n_vis)]
    layers += [LayerActivation("llm", 20.0, 2.0, 1.0) for _ in range(n_llm)]
    return ChunkActivations(rank, inflight, layers, other)


def test_block_n_counts_within_each_stack():
    ch = _chunk(0, 2, n_llm=3, n_vis=2, other=5.0)
    assert ch.bytes_with(0) == 2 * (5 + 2 * 10 + 3 * 20)
    # N = 1: first vision layer and first LLM layer recompute; during the backward one
    # recomputed layer (the largest: 20) holds its full activations again
    assert ch.bytes_with(1) == 2 * (5 + 1 + 10 + 2 + 2 * 20) + 20
    assert ch.bytes_with(3) == 2 * (5 + 2 * 1 + 3 * 2) + 20 == ch.bytes_with(9)
    assert ch.max_stack_layers == 3


def test_chooser_picks_smallest_n_that_fits_per_rank():
    # rank 0: 2 in flight, 4 LLM layers; rank 1: 1 in flight, 4 LLM layers
    chunks = [_chunk(0, 2, 4), _chunk(1, 1, 4)]
    static = [100.0, 100.0]
    # rank 0 with N > 0: 100 + 2 (N*2 + (4-N)*20) + 20; rank 1: 100 + N*2 + (4-N)*20 + 20
    choice = choose_recompute(chunks, static, budget_bytes=210.0)
    # rank 0: N=2 -> 100 + 2*44 + 20 = 208 <= 210 (N=1 -> 100 + 2*62 + 20 = 244)
    # rank 1: N=0 -> 180 <= 210
    assert choice.recompute_num_layers == [{"llm": 2}, {"llm": 0}]
    assert choice.rank_bytes == [208.0, 180.0]
    assert choose_recompute(chunks, static, 1e9).recompute_num_layers == [{"llm": 0}] * 2
    # rank 0 needs N=4 (136); rank 1 too (N=3 -> 146)
    assert choose_recompute(chunks, static, 136.0).recompute_num_layers == [{"llm": 4}] * 2
    assert choose_recompute(chunks, static, 150.0).recompute_num_layers == [{"llm": 4},
                                                                           {"llm": 3}]


def test_vpp_chunks_of_a_rank_share_n():
    chunks = [_chunk(0, 2, 2), _chunk(1, 2, 2), _chunk(0, 1, 2), _chunk(1, 1, 2)]
    choice = choose_recompute(chunks, [0.0, 0.0], budget_bytes=2 * 22 + 1 * 22 + 2 * 20)
    assert choice.recompute_num_layers == [{"llm": 1}] * 4


def test_full_recompute_not_fitting_names_the_flag():
    with pytest.raises(PlanError, match="--recompute-memory-budget"):
        choose_recompute([_chunk(0, 1, 2)], [100.0], budget_bytes=123.0)


def test_from_chain_skips_frozen_layers():
    chain = vlm_chain(2, 4, freeze_vit=True, freeze_llm=False)
    for l in chain:
        l.act_bytes, l.recompute_act_bytes, l.params = 10.0, 1.0, 1.0
    bounds = [[0, 6], [6, len(chain)]]  # llm_embed, vision_embed, 2 vit, projector, llm 0
    acts = chunk_activations(chain, bounds, 2, 1, 8)
    assert [c.inflight for c in acts] == [2, 1]
    assert [len(c.layers) for c in acts] == [1, 3]  # frozen ViT layers keep nothing
    assert acts[0].other_bytes == 10 + 10  # llm_embed + projector (trainable)
    assert static_bytes(chain, bounds, 2, MemoryModel()) == [3 * 16 + 3 * 2, 4 * 16]


def test_stacks_get_their_own_n_cheapest_bytes_first():
    """Vision layers free 29 bytes for 1 unit of time, LLM layers 18 for 3: a budget that
    needs 50 bytes freed recomputes two vision layers, not LLM ones."""
    layers = [LayerActivation("vision", 30.0, 1.0, 1.0) for _ in range(3)]
    layers += [LayerActivation("llm", 20.0, 2.0, 3.0) for _ in range(3)]
    ch = ChunkActivations(0, 1, layers)
    full = ch.bytes_with(0)
    choice = choose_recompute([ch], [0.0], budget_bytes=full - 50 + 30)  # + transient 30
    assert choice.recompute_num_layers == [{"vision": 2, "llm": 0}]


def test_knapsack_is_optimal_against_brute_force():
    rng = random.Random(3)
    for _ in range(60):
        chunks = [ChunkActivations(c % 2, rng.randint(1, 3), [
            LayerActivation(rng.choice(["vision", "audio", "llm"]), rng.randint(5, 40),
                            rng.randint(0, 4), rng.randint(1, 9))
            for _ in range(rng.randint(1, 5))], rng.randint(0, 9))
            for c in range(rng.randint(2, 4))]
        static, budget = [rng.randint(0, 50), rng.randint(0, 50)], rng.randint(50, 400)
        cheapest = []
        for rank in (0, 1):
            mine = [ch for ch in chunks if ch.rank == rank]
            stacks = sorted({l.stack for ch in mine for l in ch.layers})
            tops = [max(ch.stack_layers().get(s, 0) for ch in mine) for s in stacks]
            costs = [sum(ch.inflight * ch.cost_with(dict(zip(stacks, ns))) for ch in mine)
                     for ns in itertools.product(*(range(t + 1) for t in tops))
                     if static[rank] + sum(ch.bytes_with(dict(zip(stacks, ns)))
                                           for ch in mine) <= budget]
            cheapest.append(min(costs, default=None))
        if None in cheapest:
            with pytest.raises(PlanError, match="--recompute-memory-budget"):
                choose_recompute(chunks, static, budget)
            continue
        choice = choose_recompute(chunks, static, budget)
        for rank in (0, 1):
            mine = [(ch, n) for ch, n in zip(chunks, choice.recompute_num_layers)
                    if ch.rank == rank]
            assert sum(ch.inflight * ch.cost_with(n) for ch, n in mine) == cheapest[rank]
            assert choice.rank_bytes[rank] <= budget
