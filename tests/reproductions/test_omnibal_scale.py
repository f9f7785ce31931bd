"""OmniBal's ablation at scale (reproductions/omnibal_scale.py) and the simulator's per-micro-batch
costs it replays."""

import random

import pytest

from megatron_mm.plan.balance.loads import SampleLoad
from megatron_mm.plan.errors import PlanError
from megatron_mm.plan.schedules.generate import megatron
from megatron_mm.reproductions.omnibal_scale import ROWS, ScaleSetup, run_ablation, table
from megatron_mm.plan.schedules.simulate import ActionCosts, simulate


def test_microbatches_of_different_cost_replay_exactly():
    """PP=2, 1F1B, two micro-batches: the second twice as heavy on both stages."""
    mb = [ActionCosts(forward_s=[1.0, 1.0], backward_s=[2.0, 2.0]),
          ActionCosts(forward_s=[2.0, 2.0], backward_s=[4.0, 4.0])]
    costs = ActionCosts(forward_s=[1.0, 1.0], backward_s=[2.0, 2.0], microbatches=mb)
    # rank 1: F0 [1,2] B0 [2,4] F1 [4,6] B1 [6,10]; rank 0: F0 [0,1] F1 [1,3]
    # B0 [4,6] B1 [10,14]
    assert simulate(megatron(2, 1, 2), costs).iteration_s == pytest.approx(14.0)
    same = ActionCosts(forward_s=[1.0, 1.0], backward_s=[2.0, 2.0])
    assert simulate(megatron(2, 1, 2), same).iteration_s == pytest.approx(9.0)


def _loads(n=480, seed=0):
    """InternVL-like samples: 1-13 tiles of 256 tokens plus 20-400 text tokens."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        tiles = rng.choice([1, 1, 2, 3, 5, 7, 9, 13])
        out.append(SampleLoad(tiles, tiles * 256 + rng.randint(20, 400)))
    return out


@pytest.fixture(scope="module")
def ablation():
    setup = ScaleSetup(pipeline_model_parallel_size=2, data_parallel_size=2,
                       global_batch_size=32, micro_batch_size=4, partition_candidates=3,
                       partition_trial_steps=2, memory_budget_gb=100.0)
    return run_ablation(_loads(), setup)


def test_each_part_adds_speed(ablation):
    rows = ablation.rows
    assert [r.name for r in rows] == ROWS
    tps = [r.tokens_per_second for r in rows]
    assert tps[1] > tps[0], "balanced data beats random padded micro-batches"
    assert tps[2] >= tps[1], "the searched partition is never slower than the uniform one"
    assert tps[3] > tps[2], "recomputing less is faster"
    assert rows[2].layers_per_stage != rows[1].layers_per_stage
    assert rows[3].peak_memory_gb <= 100.0
    assert rows[3].peak_memory_gb > rows[2].peak_memory_gb
    assert all(r.recompute == "full" for r in rows[:3]) and rows[3].recompute != "full"
    assert sum(rows[0].layers_per_stage) == sum(rows[3].layers_per_stage)


def test_gpu_days_follow_the_throughput(ablation):
    first = ablation.rows[0]
    for r in ablation.rows:
        assert r.gpu_days * r.samples_per_second == pytest.approx(
            first.gpu_days * first.samples_per_second)
    text = table(ablation)
    assert "| + adaptive recompute |" in text and "61.8" in text and "21.3" in text


def test_too_few_samples_is_an_error():
    with pytest.raises(PlanError, match="fill no step|no bounds|fewer"):
        run_ablation(_loads(20), ScaleSetup(global_batch_size=1024))


def test_microbatch_chains_cost_each_hybrid_layer_by_its_kind():
    """A hybrid LLM (Qwen3.5): each packed sample's Gated DeltaNet layers grow linearly
    with its length, its full-attention layers quadratically."""
    from megatron_mm.plan.costs import flops
    from megatron_mm.plan.model import ModelSpec
    from megatron_mm.reproductions import model_zoo as zoo
    from megatron_mm.reproductions.omnibal_scale import MicrobatchChains

    model = zoo.model_pair("Qwen3.5-27B")
    model = ModelSpec(model.name, model.encoders, model.llm)
    chains = MicrobatchChains(model, tp=8)
    llm = [l for l in chains.chain(1, [4096, 2048], padded=False) if l.kind == "llm_layer"]
    assert len(llm) == 64
    for i, layer in enumerate(llm):
        want = sum(flops.llm_layer(model.llm, i, 1, s).split(8).fwd for s in (4096, 2048))
        assert layer.fwd_flops == pytest.approx(want)
    assert llm[0].fwd_flops == llm[1].fwd_flops != llm[3].fwd_flops  # layer 3: attention
