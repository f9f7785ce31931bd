"""The process groups of encoder replicas (ETP < TP), from every rank's TP group."""

import pytest

from megatron_mm.runtime.encoder_replicas import encoder_group_ranks


def _infos(tp, pp, dp):
    """Megatron-Core's default order (TP fastest, then DP, then PP): per global rank
    (its TP group, pipeline rank, CP rank)."""
    infos = []
    for rank in range(tp * pp * dp):
        start = rank - rank % tp
        infos.append((tuple(range(start, start + tp)), rank // (tp * dp), 0))
    return infos


def test_tp4_etp2_pp2():
    tp_groups, replicas, data_parallel = encoder_group_ranks(_infos(4, 2, 1), 2)
    assert tp_groups == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert replicas == [[0, 2], [1, 3], [4, 6], [5, 7]]
    # same pipeline rank and encoder-TP rank: one main copy of each encoder shard
    assert data_parallel == [[0, 2], [1, 3], [4, 6], [5, 7]]


def test_tp2_etp1_dp2():
    tp_groups, replicas, data_parallel = encoder_group_ranks(_infos(2, 1, 2), 1)
    assert tp_groups == [[0], [1], [2], [3]]
    assert replicas == [[0, 1], [2, 3]]
    assert data_parallel == [[0, 1, 2, 3]]


def test_each_kind_partitions_the_world():
    for tp, pp, dp, etp in ((4, 2, 2, 1), (4, 1, 2, 2), (2, 2, 1, 1)):
        for groups in encoder_group_ranks(_infos(tp, pp, dp), etp):
            flat = sorted(r for g in groups for r in g)
            assert flat == list(range(tp * pp * dp)), (tp, pp, dp, etp, groups)


def test_encoder_tp_must_divide_tp():
    with pytest.raises(ValueError, match="encoder TP 3 does not divide TP 4"):
        encoder_group_ranks(_infos(4, 1, 1), 3)
