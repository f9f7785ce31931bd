"""Plans are data: they round-trip through dicts and JSON unchanged."""

import json

import pytest

from megatron_mm.plan import Hardware, PipelinePlan, PlanError, StagePartition, plan_pipeline

from helpers import vlm_chain


def roundtrip(obj):
    return type(obj).from_dict(json.loads(json.dumps(obj.to_dict())))


def test_pipeline_plan_roundtrip():
    chain = vlm_chain(3, 8, recompute=True)
    hw = Hardware(p2p_bandwidth=1e11)
    plan = plan_pipeline(chain, 2, 2, "auto", 8, hw)
    back = roundtrip(plan)
    assert back == plan
    assert isinstance(back.chain[0].fwd_flops, float) and back.hardware.p2p_bandwidth == 1e11
    assert PipelinePlan.from_json(plan.to_json()) == plan
    assert back.modules_of_rank(0) == plan.modules_of_rank(0)


def test_unknown_fields_are_rejected():
    data = StagePartition(2, 1, [3, 4]).to_dict()
    assert StagePartition.from_dict(data) == StagePartition(2, 1, [3, 4], "explicit")
    data["layers"] = 7
    with pytest.raises(PlanError, match="StagePartition: unknown fields \\['layers'\\]"):
        StagePartition.from_dict(data)
