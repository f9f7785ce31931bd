"""Measured per-layer times in place of the FLOP cost model."""

import pytest

from megatron_mm.plan import PlanError, estimate, partition, StagePartition
from megatron_mm.plan.pipeline.profile import MEASURED, LayerProfile, LayerTime, apply_profile

from helpers import vlm_chain


def _profile(chain, fwd, bwd_of):
    return LayerProfile(device="test", micro_batch_size=1, seq_length=8,
                        tensor_model_parallel_size=1, frozen=["vision_model"],
                        layers=[LayerTime(l.module, fwd, bwd_of(l)) for l in chain])


def test_measured_seconds_drive_partition_and_estimate(tmp_path):
    chain = vlm_chain(2, 4)  # frozen ViT, trained projector, frozen LLM (input grads)
    # measured: every forward 1 s; backward 2 s where one runs
    profile = _profile(chain, 1.0, lambda l: 2.0 if l.runs_backward else 0.0)
    path = tmp_path / "profile.json"
    profile.save(str(path))
    timed = apply_profile(chain, LayerProfile.load(str(path)))
    assert [l.total_flops for l in timed] == [1, 1, 1, 1, 3, 3, 3, 3, 3, 3]
    part = StagePartition(2, 1, [5, 5])
    est = estimate(timed, part, 4, MEASURED)
    assert est.stage_time_s == [7.0, 15.0]  # seconds per micro-batch on each stage
    assert partition(timed, 2, 1, "auto").layers_per_chunk == [6, 4]


def test_profile_of_another_model_or_freezing_is_refused(tmp_path):
    chain = vlm_chain(2, 4)
    with pytest.raises(PlanError, match="no time for 1 modules"):
        apply_profile(chain, _profile(chain[:-1], 1.0, lambda l: 0.0))
    with pytest.raises(PlanError, match="same --freeze-\\* flags"):
        apply_profile(chain, _profile(chain, 1.0, lambda l: 1.0))
    with pytest.raises(PlanError, match="no such file"):
        LayerProfile.load(str(tmp_path / "missing.json"))
