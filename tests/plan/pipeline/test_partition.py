"""Partition policies, the flag syntax, and the VPP chunk -> rank mapping."""

import dataclasses

import pytest

from megatron_mm.plan import PlanError, StagePartition, parse_partition_flag, partition

from helpers import vlm_chain


def test_chunk_to_rank_mapping_is_megatrons_interleaving():
    part = StagePartition(2, 4, [1] * 8)
    # Megatron's docstring: 8 layers, 2 stages, 4 chunks -> stage 0: [0] [2] [4] [6]
    assert [part.rank_of_chunk(c) for c in range(8)] == [0, 1, 0, 1, 0, 1, 0, 1]
    assert part.chunks_of_rank(0) == [0, 2, 4, 6] and part.chunks_of_rank(1) == [1, 3, 5, 7]
    assert part.layer_ranks() == [0, 1, 0, 1, 0, 1, 0, 1]
    part = StagePartition(3, 2, [2, 1, 3, 1, 1, 2])
    assert part.chunk_bounds() == [[0, 2], [2, 3], [3, 6], [6, 7], [7, 8], [8, 10]]
    assert part.layers_per_stage == [[2, 1], [1, 1], [3, 2]]
    assert part.layer_ranks() == [0, 0, 1, 2, 2, 2, 0, 1, 2, 2]


def test_uniform_reproduces_megatron_layout():
    chain = vlm_chain(5, 16)  # 1 + 5 + 1 encoder-side, llm_embed, 16 layers, head = 25
    part = partition(chain, 4, 1, "uniform")
    assert part.layers_per_chunk == [7 + 1 + 4, 4, 4, 4 + 1] and part.policy == "uniform"
    part = partition(chain, 2, 2, "uniform")
    assert part.layers_per_chunk == [12, 4, 4, 5]
    ranks = part.layer_ranks()
    llm = [ranks[i] for i, l in enumerate(chain) if l.kind == "llm_layer"]
    # Megatron: 16 layers, PP 2, VPP 2 -> rank 0 holds layers 0-3 and 8-11
    assert llm == [0] * 4 + [1] * 4 + [0] * 4 + [1] * 4
    assert all(ranks[i] == 0 for i, l in enumerate(chain) if l.branch == "vision")
    assert ranks[-1] == 1  # output layer on the last chunk, which runs on the last rank


def test_uniform_uneven_layers_go_to_first_chunks():
    chain = vlm_chain(1, 10)
    assert partition(chain, 4, 1, "uniform").layers_per_chunk == [3 + 1 + 3, 3, 2, 2 + 1]
    with pytest.raises(PlanError, match="5 LLM layers cannot fill"):
        partition(vlm_chain(1, 5), 3, 2, "uniform")


def test_parse_partition_flag():
    assert parse_partition_flag("auto") == "auto"
    assert parse_partition_flag(" Uniform ") == "uniform"
    assert parse_partition_flag("balanced") == "balanced"
    assert parse_partition_flag("search") == "search"
    assert parse_partition_flag("4,8,8,8") == [4, 8, 8, 8]
    assert parse_partition_flag("4, 8,8 ,8") == [4, 8, 8, 8]
    for bad in ("", "fast", "4;8", "4,,8", "4,8.5", "4,x"):
        with pytest.raises(PlanError, match="auto, uniform, balanced, search or a comma-separated"):
            parse_partition_flag(bad)
    for bad in ("4,0,8", "-1,5"):
        with pytest.raises(PlanError, match="at least one layer"):
            parse_partition_flag(bad)


def test_explicit_list():
    chain = vlm_chain(2, 4)  # 10 layers
    part = partition(chain, 2, 1, parse_partition_flag("6,4"))
    assert part.layers_per_chunk == [6, 4] and part.policy == "explicit"
    assert partition(chain, 2, 1, "3,7").layers_per_chunk == [3, 7]
    with pytest.raises(PlanError, match=r"sum to 9, but the chain has 10 layers "
                                        r"\(1 llm_embed \+ 1 vision_embed"):
        partition(chain, 2, 1, [5, 4])
    with pytest.raises(PlanError, match=r"lists 3 stages, but PP x VPP = 2 x 1 = 2"):
        partition(chain, 2, 1, [4, 3, 3])
    with pytest.raises(PlanError, match=r"lists 2 stages, but PP x VPP = 2 x 2 = 4"):
        partition(chain, 2, 2, [6, 4])


def test_too_few_layers_and_bad_sizes():
    chain = vlm_chain(0, 1)  # 5 layers
    with pytest.raises(PlanError, match="fewer than PP x VPP = 6"):
        partition(chain, 3, 2)
    with pytest.raises(PlanError, match="must be >= 1"):
        partition(chain, 0, 1)
    with pytest.raises(PlanError, match="needs 4 entries"):
        StagePartition(2, 2, [1, 2, 3])


def test_memory_limit_is_checked_for_every_policy():
    chain = [dataclasses.replace(l, params=1.0)  # 16 B each, trained
             for l in vlm_chain(4, 8, freeze_vit=False, freeze_llm=False)]
    # uniform puts 7 encoder-side layers + 4 LLM layers on stage 0: 176 B
    with pytest.raises(PlanError, match=r"uniform partition .* stage 0 needs .* over the "
                                        r"memory limit"):
        partition(chain, 2, 1, "uniform", 170.0)
    with pytest.raises(PlanError, match="explicit partition"):
        partition(chain, 2, 1, [14, 2], 170.0)
    part = partition(chain, 2, 1, "auto", 170.0)
    assert max(part.layers_per_chunk) * 16 <= 170
