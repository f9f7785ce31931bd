"""The planner's hybrid CP (plan/context_parallel/hybrid.py): the Gated DeltaNet layers'
all-to-all bytes by hand, the head check naming the flags, and the work per CP rank of
Qwen3.5-27B's layout (48 GDN + 16 full-attention layers) under the package's assignment
against Megatron's zigzag."""

import numpy as np
import pytest

from megatron_mm.plan import PlanError
from megatron_mm.plan.context_parallel.hybrid import (
    gdn_all_to_all, gdn_cp_error, gdn_step_seconds, hybrid_cp_balance)
from megatron_mm.plan.model import LinearAttentionSpec
from megatron_mm.reproductions.mask_families import family_codes
from megatron_mm.reproductions.model_zoo import LLMS

QWEN35 = LLMS["qwen3.5-27b"]
GDN = QWEN35.linear_attention  # 16 key / 48 value heads of 128


def test_all_to_all_bytes_by_hand():
    # Qwen3.5-27B's GDN, S = 32768 on CP = 2, TP = 1, bf16, each rank 16384 tokens.
    # cp2hp carries q, k, v, z, beta, alpha: 2*2048 + 2*6144 + 2*48 = 16480 channels a
    # token, half of them (the other head group) of the rank's 16384 tokens leave it;
    # hp2cp carries the 6144 gated-norm channels: the rank's 3072 of each of the other
    # rank's 16384 tokens. Sent = received = 16384 * (8240 + 3072) * 2 bytes.
    a2a = gdn_all_to_all(GDN, 16384, 32768, 2)
    assert a2a.sent == a2a.received == 16384 * (8240 + 3072) * 2 == 370_671_616
    # TP = 4 divides the channels, 2 rows double them, CP = 1 moves nothing
    assert gdn_all_to_all(GDN, 16384, 32768, 2, 4, rows=2).sent == 370_671_616 / 2
    assert gdn_all_to_all(GDN, 32768, 32768, 1).sent == 0.0
    # an uneven split: 4 ranks, this one holds 1000 of 4000 tokens, W_in 16480, W_out 6144
    uneven = gdn_all_to_all(GDN, 1000, 4000, 4)
    assert uneven.sent == 2 * (1000 * 3 / 4 * 16480 + 3000 / 4 * 6144)
    assert uneven.received == 2 * (3000 / 4 * 16480 + 1000 * 3 / 4 * 6144)


def test_heads_must_split_over_tp_x_cp():
    assert gdn_cp_error(GDN, 4, 4) is None  # 16 key heads, 48 value heads over 16 ranks
    assert "--linear-num-key-heads (16) is not divisible by --tensor-model-parallel-size x " \
        "--context-parallel-size (4 x 8)" in gdn_cp_error(GDN, 4, 8)
    assert gdn_cp_error(LinearAttentionSpec(linear_num_key_heads=6,
                                            linear_num_value_heads=12), 1, 2) is None
    with pytest.raises(PlanError, match="--context-parallel-size"):
        hybrid_cp_balance(QWEN35, np.zeros(4096, np.int64), 32)


def test_qwen35_balance_table():
    """CP = 4, 32K tokens: the GDN rule is the same on every rank (per head group), the
    full layers' attention follows the assignment; ours is even where zigzag is not
    (packed documents), the traffic is the formula's."""
    for family in ("causal", "packed", "encoder_embedded"):
        codes = family_codes(family, 32768, 0)
        ours = hybrid_cp_balance(QWEN35, codes, 4, "ours")
        zigzag = hybrid_cp_balance(QWEN35, codes, 4, "zigzag")
        assert (ours.gdn_layers, ours.full_layers) == (48, 16)
        assert sum(ours.tokens) == 32768 and len(set(ours.gdn_flops)) == 1
        assert ours.imbalance("attention_flops") <= 1.03, family
        assert ours.imbalance() <= zigzag.imbalance() + 1e-9, family
        n = max(ours.tokens)
        assert ours.a2a_bytes == pytest.approx(2 * max(
            n * 3 / 4 * 16480 + (32768 - n) / 4 * 6144,
            (32768 - n) / 4 * 16480 + n * 3 / 4 * 6144))
        # forward + backward: two passes over the 48 GDN layers
        assert ours.step_a2a_bytes() == 96 * ours.a2a_bytes
        assert gdn_step_seconds(ours, 1e9) == pytest.approx(96 * ours.a2a_bytes / 1e9)
    packed = family_codes("packed", 32768, 0)
    assert hybrid_cp_balance(QWEN35, packed, 4, "zigzag").imbalance("attention_flops") > 1.1
