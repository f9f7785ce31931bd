"""A comparison of partitions is data: it round-trips through dicts and JSON unchanged."""

import json

from megatron_mm.plan import PipelinePlan
from megatron_mm.reproductions.comparison import Comparison, Scenario, compare


def test_comparison_roundtrip():
    result = compare(Scenario(pair="VLM-S", pipeline_model_parallel_size=2,
                              num_microbatches=4))
    back = Comparison.from_dict(json.loads(json.dumps(result.to_dict())))
    assert back == result
    assert isinstance(back.plans["auto"], PipelinePlan)
