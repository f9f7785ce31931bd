"""The planner's Qwen3-VL terms, each shown to change an outcome: attention within whole
frames (quadratic in each frame's tokens) against windows moves the partition; the
DeepStack mergers' FLOPs move it too; the DeepStack features' bytes cross the stage
boundaries (partition estimate and search) and lengthen the simulated schedule (the
separate placement's program too)."""

from dataclasses import replace

import pytest

from megatron_mm.plan import PlanError
from megatron_mm.plan.costs.hardware import Hardware, Interconnect
from megatron_mm.plan.costs.unit_costs import TimeModel
from megatron_mm.plan.model import EncoderSpec, ModelSpec, TransformerSpec, Workload
from megatron_mm.plan.pipeline.chain import build_chain
from megatron_mm.plan.pipeline.partition import StagePartition, partition
from megatron_mm.plan.pipeline.partition_search import score
from megatron_mm.plan.schedules.problem import ScheduleProblem
from megatron_mm.plan.schedules.encoder_pipeline import (megatron_costs, plan_encoder_pipeline,
                                                         schedule_costs)
from megatron_mm.plan.schedules.generate import coarse
from megatron_mm.plan.schedules.separate import separate
from megatron_mm.plan.schedules.separate_placements import separate_model_placements
from megatron_mm.plan.schedules.simulate import simulate

VIT = TransformerSpec(hidden_size=1152, num_layers=12, ffn_hidden_size=4304,
                      num_attention_heads=16, add_bias_linear=True)
LLM = TransformerSpec(hidden_size=2048, num_layers=8, ffn_hidden_size=6144,
                      num_attention_heads=16, num_query_groups=8, gated_linear_unit=True,
                      vocab_size=32000)
WORK = Workload(seq_length=8192)
DEEPSTACK = (2, 5, 8)


def chain(spans=(), deepstack=()):
    """One 16384-patch frame per sample (4096 LLM tokens after the 2 x 2 merge)."""
    enc = EncoderSpec(name="vision", modality="vision", transformer=VIT,
                      tokens_per_item=16384, llm_tokens_per_item=4096,
                      projector_input_size=4608, projector_ffn_hidden_size=4608,
                      attention_spans=spans, deepstack_layers=deepstack)
    return build_chain(ModelSpec(name="qwen3-vl-like", encoders=[enc], llm=LLM), WORK)


def test_attention_within_whole_frames_is_quadratic_and_moves_the_partition():
    frame, windows = chain(), chain(spans=(64,) * 256)
    vit = lambda c: next(l for l in c if l.kind == "vision_layer")  # noqa: E731
    assert vit(frame).fwd_flops > 3 * vit(windows).fwd_flops  # 16384^2 vs 256 x 64^2 pairs
    assert partition(frame, 2, 1, "auto").layers_per_chunk == [11, 13]
    assert partition(windows, 2, 1, "auto").layers_per_chunk == [17, 7]
    with pytest.raises(PlanError, match="attention spans"):
        chain(spans=(64,))


def test_deepstack_mergers_count_and_move_the_partition():
    plain, deep = chain(), chain(deepstack=DEEPSTACK)
    proj = lambda c: next(l for l in c if l.kind == "projector")  # noqa: E731
    assert proj(deep).fwd_flops == 4 * proj(plain).fwd_flops  # the final merger + 3
    assert proj(deep).params == 4 * proj(plain).params
    assert partition(plain, 8, 1, "auto").layers_per_chunk == [4, 2, 2, 2, 2, 4, 4, 4]
    assert partition(deep, 8, 1, "auto").layers_per_chunk == [4, 2, 2, 2, 3, 3, 4, 4]


def test_deepstack_bytes_cross_the_stage_boundaries():
    deep = chain(deepstack=DEEPSTACK)
    vit = [l for l in deep if l.kind == "vision_layer"]
    llm = [l for l in deep if l.kind == "llm_layer"]
    proj = next(l for l in deep if l.kind == "projector")
    # inside the tower: the DeepStack layers' outputs so far; after the mergers: all three
    # merged features; after LLM layer i: those of the DeepStack layers after it
    assert [l.deepstack_bytes / l.out_bytes for l in vit] == [0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 3]
    assert proj.deepstack_bytes == 3 * proj.out_bytes
    assert [l.deepstack_bytes / proj.out_bytes for l in llm[:4]] == [2, 1, 0, 0]
    # the partition search ranks by the bytes crossing: a cut after LLM layer 1 sends the
    # hidden state and LLM layer 2's merged feature
    counts = [17, 7]  # embed, ViT embed, 12 ViT layers, projector, LLM 0-1 | ...
    plain_sent = score(chain(), counts, 2).boundary_bytes
    assert llm[1].deepstack_bytes > 0
    assert score(deep, counts, 2).boundary_bytes == plain_sent + llm[1].deepstack_bytes
    # a cut inside the tower after ViT layer 5 sends DeepStack layers 2 and 5's outputs too
    inside = [8, 16]  # embed, ViT embed, ViT 0-5 | ...
    assert vit[5].deepstack_bytes == 2 * vit[5].out_bytes
    assert (score(deep, inside, 2).boundary_bytes
            == score(chain(), inside, 2).boundary_bytes + vit[5].deepstack_bytes)


def test_deepstack_volume_lengthens_the_simulated_schedule():
    deep = chain(deepstack=DEEPSTACK)
    plan = plan_encoder_pipeline(deep, 2, 1, [2, 8])  # [embed, LLM 0] [LLM 1-7, head]
    costs = schedule_costs(deep, plan.llm_partition, plan.pieces, Hardware(),
                           links=Interconnect())
    time = TimeModel(Hardware(), Interconnect())
    llm0 = next(l for l in deep if l.kind == "llm_layer")
    # chunk 0 ([embed, LLM 0] + the mergers) sends LLM layers 1 and 2's features on;
    # the tower's first piece (ViT 0-5) carries layers 2 and 5's outputs to the second
    assert costs.deepstack_p2p_s == [time.p2p_s(llm0.deepstack_bytes), 0.0]
    vit = [l for l in deep if l.kind == "vision_layer"]
    assert costs.encoder_deepstack_p2p_s == [
        time.p2p_s(vit[e - 1].deepstack_bytes) for _, e in plan.pieces[0].layers]
    schedule = coarse(ScheduleProblem(2, 4, encoder_stages=2, pieces=1))
    free = replace(costs, deepstack_p2p_s=[], encoder_deepstack_p2p_s=[])
    assert simulate(schedule, costs).iteration_s > simulate(schedule, free).iteration_s


def test_deepstack_volume_in_the_separate_program():
    """The tower whole on an encoder rank of its own (``--encoder-schedule separate``): its
    one message to the LLM carries all three DeepStack layers' outputs, LLM chunk 0 (with
    the mergers) sends LLM layers 1 and 2's merged features on; both lengthen the
    separate program's simulated iteration."""
    deep = chain(deepstack=DEEPSTACK)
    part = StagePartition(2, 1, [2, 8])  # over the LLM's own chain: [embed, LLM 0] [...]
    pieces = separate_model_placements(deep, part).pieces
    costs = schedule_costs(deep, part, pieces, Hardware(), links=Interconnect())
    time = TimeModel(Hardware(), Interconnect())
    vit = [l for l in deep if l.kind == "vision_layer"]
    llm0 = next(l for l in deep if l.kind == "llm_layer")
    assert costs.encoder_deepstack_p2p_s == [time.p2p_s(3 * vit[-1].out_bytes)]
    assert costs.deepstack_p2p_s == [time.p2p_s(llm0.deepstack_bytes), 0.0]
    program = separate(ScheduleProblem(2, 4, llm_data_parallel_size=1,
                                       encoder_data_parallel_size=1, costs=costs))
    free = replace(costs, deepstack_p2p_s=[], encoder_deepstack_p2p_s=[])
    assert simulate(program, costs).iteration_s > simulate(program, free).iteration_s


def test_deepstack_volume_in_megatron_schedule_costs():
    deep = chain(deepstack=DEEPSTACK)
    # [embed, ViT embed, ViT 0-11, mergers, LLM 0] [LLM 1-7, head]: two features cross
    costs = megatron_costs(deep, StagePartition(2, 1, [16, 8]), Hardware(),
                           links=Interconnect())
    llm0 = next(l for l in deep if l.kind == "llm_layer")
    assert costs.deepstack_p2p_s == [TimeModel(Hardware(), Interconnect()).p2p_s(
        llm0.deepstack_bytes), 0.0]
    assert llm0.deepstack_bytes > 0
    assert not megatron_costs(chain(), StagePartition(2, 1, [16, 8]), Hardware(),
                              links=Interconnect()).deepstack_p2p_s
