"""OmniBal's metrics on hand-computed steps."""

import pytest

from megatron_mm.plan.balance import SampleLoad, imbalance, measure, padding_ratio


def test_padding_ratio_and_imbalance_by_hand():
    # lengths 4, 2, 1 padded to 4: (0 + 2 + 3) / (4 * 3)
    assert padding_ratio([4, 2, 1]) == pytest.approx(5 / 12)
    assert padding_ratio([3, 3]) == 0
    # ranks 10, 5, 10, 0: (0 + 5 + 0 + 10) / (10 * 4)
    assert imbalance([10, 5, 10, 0]) == pytest.approx(15 / 40)
    assert imbalance([7, 7, 7]) == 0 and imbalance([0, 0]) == 0


def test_measure_packed_and_padded():
    loads = [SampleLoad(1, 10), SampleLoad(3, 4), SampleLoad(2, 6), SampleLoad(2, 6)]
    steps = [[[0, 1], [2, 3]]]  # one step, two ranks
    packed = measure(steps, loads, packed=True)
    assert packed.padding == 0 and packed.vision_imbalance == 0  # 4 tiles each
    assert packed.llm_imbalance == pytest.approx((14 - 12) / (14 * 2))
    padded = measure(steps, loads, packed=False)
    assert padded.padding == pytest.approx(((0 + 6) / 20 + 0) / 2)
    # a padded rank computes t_max * B tokens: 20 vs 12
    assert padded.llm_imbalance == pytest.approx((20 - 12) / (20 * 2))
    assert padded.samples_per_microbatch == 2 and padded.steps == 1
