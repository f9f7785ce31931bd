"""Optimus' planner: encoder plans and bubble schedules against the Megatron baseline on
the cost model, and the simulator's encoder metrics."""

import json

import pytest

from megatron_mm.plan import PlanError
from megatron_mm.reproductions import model_zoo
from megatron_mm.plan.schedules.problem import ScheduleProblem
from megatron_mm.plan.schedules.action_costs import CostModel, EncoderPlan, LLMLayout
from megatron_mm.plan.schedules.actions import validate
from megatron_mm.plan.schedules.encoder_planner import EncoderSchedulePlan, plan_encoder_schedule
from megatron_mm.plan.schedules.bubble import bubble
from megatron_mm.plan.schedules.generate import EncoderLayout, coarse, megatron
from megatron_mm.plan.costs.hardware import A100, A100_LINKS, H100, H100_LINKS
from megatron_mm.reproductions.optimus_reference import RUNS, coarse_hidden, plan_run
from megatron_mm.plan.schedules.simulate import ActionCosts, simulate


@pytest.fixture(scope="module")
def at_3072():
    run = next(r for r in RUNS if r.layout.data_parallel_size == 48)
    # one piece per stage, and four: whole layers (1 or 2) or 3 attention / MLP kernels
    return run, plan_run(run, pieces=(1, 4))


@pytest.mark.slow  # the 3072-GPU plan: about 10 s
def test_optimus_3072_gpus_beats_megatron_and_hides_the_encoder(at_3072):
    run, r = at_3072
    assert r.gpus == 3072 and r.best.num_microbatches == 16
    assert r.speedup >= run.paper_speedup  # over Megatron-LM's plain 1F1B, as the paper
    assert r.speedup_interleaved > 1.1  # over Megatron at the plan's VPP: encoder placement
    # paper (Table 7): 85.0% of encoder work inside LLM bubbles with fine-grained filling:
    # small pieces in the LLM's TP bubbles, each reducing its gradients on its own
    assert r.encoder_hidden_fraction >= run.paper_hidden_fine
    assert r.encoder_hidden_fraction > coarse_hidden(r)
    assert r.best.encoder_pieces > 1
    assert any(a.in_tp_bubble for rank in r.schedule.ranks for a in rank)
    validate(r.schedule)
    assert r.schedule.num_microbatches == 16 and r.schedule.encoder_stages >= 1
    # whole-layer pieces are too long for the LLM's TP bubbles: attention / MLP kernels fit
    assert r.best.sublayer
    layers = [c for c in r.candidates if not c.sublayer and c.schedule == "bubble"]
    assert {c.encoder_pieces for c in layers} == {1, 4}
    assert max(c.encoder_hidden_fraction for c in layers) < run.paper_hidden_fine


@pytest.mark.slow  # the same plan
def test_plan_record_round_trips(at_3072):
    _, r = at_3072
    back = EncoderSchedulePlan.from_dict(json.loads(json.dumps(r.to_dict())))
    assert back.best == r.best and back.schedule == r.schedule
    assert [c.iteration_s for c in r.candidates] == sorted(c.iteration_s for c in r.candidates)


def test_coarse_hidden_share_follows_the_paper():
    """Paper Table 7: the coarse schedule hides 34.3 / 45.8 / 68.7% of the encoder work at
    32 / 24 / 16 micro-batches (the LLM's bubbles shrink relative to the work as
    micro-batches grow); simulated with the encoder's reductions after its backward, the
    same rise, under the paper (optimus_reference)."""
    shares = []
    for run in RUNS[:3]:  # the encoder plan the fine schedule picks: PP 8, TP 8
        model = model_zoo.model_pair(run.pair, img_h=224, img_w=448)
        cm = CostModel(model, run.layout, H100, H100_LINKS)
        costs = cm.optimus(EncoderPlan.of(run.layout, 8, 8), 1)
        s = coarse(ScheduleProblem(8, run.layout.num_microbatches,
                                   virtual_pipeline_model_parallel_size=12, encoder_stages=8,
                                   grad_sync=True, encoder_grad_sync=True))
        shares.append(simulate(s, costs, False).encoder_hidden_fraction)
    assert shares == sorted(shares)
    for share, run in zip(shares, RUNS[:3]):
        assert run.paper_hidden_coarse - 0.25 < share <= run.paper_hidden_coarse
    # one image per sample: the bubbles swallow more of the (halved) encoder
    assert plan_run(RUNS[2], images_per_sample=1, pieces=(1,),
                    schedules=("coarse",)).encoder_hidden_fraction > shares[2] + 0.2


def test_memory_rejects_plans_that_do_not_fit():
    model = model_zoo.model_pair("Optimus-D-224", 224, 224)
    lay = LLMLayout(8, 8, 48, 12, 2, 1536, 2048, True)
    cm = CostModel(model, lay, H100, H100_LINKS)
    # the whole ViT-22B on every GPU: 22 B params x 6 bytes alone exceed 80 GB
    assert cm.memory_bytes(EncoderPlan.of(lay, 1, 1)) > 80e9
    r = plan_encoder_schedule(model, lay, H100, H100_LINKS, pieces=(1,),
                              schedules=("coarse",), memory_limit_bytes=60e9)
    assert any("encoder PP 1 TP 1" in why for why in r.rejected)
    with pytest.raises(PlanError, match="no encoder plan fits"):
        plan_encoder_schedule(model, lay, H100, H100_LINKS, memory_limit_bytes=1e9)


def test_encoder_plan_divides_the_llm_plan():
    lay = LLMLayout(8, 8, 2, 1, 1, 64)
    assert EncoderPlan.of(lay, 2, 4).encoder_data_parallel_size == 2 * 4 * 2
    with pytest.raises(PlanError, match="must divide"):
        EncoderPlan.of(lay, 3, 8)
    with pytest.raises(PlanError, match="--global-batch-size"):
        LLMLayout(8, 8, 2, 1, 3, 64)


def test_simulation_reports_encoder_busy_time_and_hidden_share():
    pp, m = 4, 8
    costs = ActionCosts([1.0] * pp, [2.0] * pp, [0.5] * pp, [1.0] * pp)
    sim = simulate(coarse(ScheduleProblem(pp, m)), costs)
    assert sim.encoder_busy_s == [m * 1.5] * pp
    assert sim.llm_only_iteration_s == pytest.approx((m + pp - 1) * 3.0)
    expected = 1 - (sim.iteration_s - sim.llm_only_iteration_s) / (m * 1.5)
    assert sim.encoder_hidden_fraction == pytest.approx(min(1.0, max(0.0, expected)))
    assert 0.0 <= sim.encoder_hidden_fraction < 1.0
    assert simulate(megatron(pp, 1, m), costs).encoder_hidden_fraction is None
    # data-parallel bubbles: the LLM waits for the all-gather, the rank for the scatter
    dp = ActionCosts([1.0] * pp, [2.0] * pp, llm_start_s=0.5, llm_end_s=0.25)
    assert simulate(megatron(pp, 1, m), dp).iteration_s == pytest.approx(
        (m + pp - 1) * 3.0 + 0.75)
    assert simulate(megatron(pp, 1, m), dp, timeline=False).timeline == []


def test_frozen_encoder_schedules_forwards_only():
    model = model_zoo.model_pair("Optimus-small-224", 224, 448).with_freeze(
        encoders=True, projectors=False, llm=False)
    r = plan_encoder_schedule(model, LLMLayout(4, 2, 1, 2, 2, 16, 2048, True), A100,
                              A100_LINKS, micro_batch_sizes=[1, 2])
    assert not r.schedule.encoder_trainable
    assert not any(a.kind == "EB" for rank in r.schedule.ranks for a in rank)
    assert r.speedup > 1.0 and {c.micro_batch_size for c in r.candidates} <= {1, 2}


@pytest.fixture(scope="module")
def vision_and_audio():
    model = model_zoo.model_pair("VALM-M")  # a 32-layer ViT and a 24-layer Whisper
    return model, plan_encoder_schedule(model, LLMLayout(4, 2, 1, 1, 1, 8, 8192, True), H100,
                                        H100_LINKS, pieces=(1, 2))


def test_vision_and_audio_are_planned_together_each_with_its_own_layout(vision_and_audio):
    model, r = vision_and_audio
    b, s = r.best, r.schedule
    assert len(b.other_encoders) == 1
    vision = EncoderLayout(b.encoder_pipeline_model_parallel_size, b.encoder_pieces, b.reverse)
    audio = b.other_encoders[0]
    validate(s)
    assert s.encoder_spans() == [(0, len(vision.ranks(4))),
                                 (len(vision.ranks(4)), s.encoder_stages)]
    assert s.encoder_ranks == vision.ranks(4) + audio.ranks(4)
    # the small audio encoder on fewer ranks than the vision encoder
    assert len(set(audio.ranks(4))) < len(set(vision.ranks(4)))
    # the audio encoder's layout is its own choice: no other layout of it, beside the
    # chosen vision layout, simulates faster
    cm = CostModel(model, r.layout, H100, H100_LINKS)
    plan = EncoderPlan.of(r.layout, b.encoder_pipeline_model_parallel_size,
                          b.encoder_tensor_model_parallel_size)
    settings = dict(encoder_replicas=1, grad_sync=True, encoder_grad_sync=True)
    times = {}
    for stages in (1, 2, 4):
        for reverse in (False, True):
            other = EncoderLayout(stages, 1, reverse)
            costs = cm.optimus(plan, b.encoder_pieces, b.sublayer, b.reverse, [other])
            problem = ScheduleProblem(4, b.num_microbatches, costs=costs,
                                      layouts=[vision, other], **settings)
            sched = (bubble if b.schedule == "bubble" else coarse)(problem)
            times[(stages, reverse)] = simulate(sched, costs, False).iteration_s
    assert b.iteration_s <= min(times.values()) + 1e-9
    assert (audio.encoder_pipeline_model_parallel_size, audio.reverse) in times
    assert r.candidates[0].iteration_s == b.iteration_s
