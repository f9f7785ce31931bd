"""--encoder-schedule auto: the training plan simulates megatron, coarse and bubble (each
encoder PP, piece count and encoder TP) and separate (each encoder rank count and the
LLM's PP on the ranks left) on the run's own costs, with the real vocabulary, and the run
takes the fastest; the plan records and checkpoints the choice. (That the chosen run
equals one process is test_pipeline_parallel's ``pp2-auto-*`` cases,
test_audio_training's ``pp2-auto`` and test_separate_training's ``auto-separate``.)"""

import pytest

from megatron_mm.plan.schedules.problem import ScheduleProblem
from megatron_mm.plan.schedules.encoder_pipeline import megatron_costs
from megatron_mm.plan.schedules.generate import megatron
from megatron_mm.plan.costs.hardware import Hardware
from megatron_mm.plan.pipeline.partition import partition
from megatron_mm.plan.schedules.simulate import simulate
from megatron_mm.training.cli.arguments import parse_args
from megatron_mm.training.planning.time_inputs import time_inputs

from plans import plan_of, separate_profile, slow_link_profile
from train_workers import TINY_MODEL

PP2 = ["--pipeline-model-parallel-size", "2", "--micro-batch-size", "2",
       "--global-batch-size", "8"]
TP2 = ["--tensor-model-parallel-size", "2"]
AUTO = ["--encoder-schedule", "auto"]


def test_auto_takes_the_fastest_simulated_alternative():
    config, plan = plan_of(TINY_MODEL + PP2 + AUTO, 2)
    # the flags stay as typed: the plan chooses
    assert config.encoder_schedule.encoder_schedule == "auto"
    choice = plan.schedule.auto
    kinds = {(a.schedule, a.encoder_pipeline_model_parallel_size, a.encoder_pieces)
             for a in choice.alternatives}
    # a 2-layer ViT: 1 or 2 stages, pieces that fit its layers
    assert kinds == {("megatron", None, 1), ("separate", None, 1)} | {
        (k, s, p) for k in ("coarse", "bubble") for s, p in ((1, 1), (1, 2), (2, 1))}
    assert choice.chosen.iteration_s == min(a.iteration_s for a in choice.alternatives)
    run = plan.run_config(config).encoder_schedule
    assert run.encoder_schedule == choice.chosen.schedule
    if choice.chosen.schedule != "megatron":
        assert (run.encoder_pipeline_model_parallel_size, run.encoder_pieces) == (
            choice.chosen.encoder_pipeline_model_parallel_size, choice.chosen.encoder_pieces)
        assert plan.encoder_plan is not None
    # the megatron alternative is Megatron-Core's order on the partition the run would use,
    # on the plan's chain (the tokenizer's vocabulary)
    part = partition(plan.chain, 2, 1, config.pipeline.pipeline_partition,
                     num_microbatches=4)
    expected = simulate(megatron(2, 1, 4), megatron_costs(plan.chain, part, Hardware(),
                                                          **time_inputs(config)), False)
    got = next(a for a in choice.alternatives if a.schedule == "megatron")
    assert got.iteration_s == pytest.approx(expected.iteration_s)
    lines = choice.lines()
    assert lines[0].startswith(f"> --encoder-schedule auto chose {choice.chosen.describe()}")
    assert len(lines) == 3 + len(choice.alternatives)
    # what the times rest on (no profile: the cost model's hardware, named) and the ties
    # (the tiny ViT costs next to nothing: schedules that only move it tie)
    assert lines[1] == ("   times from the cost model's default hardware, H100 SXM, bf16 "
                        "dense at 50% of 989 TFLOP/s, not this machine (no --pipeline-profile;"
                        " tools/profile_layers.py measures one on it)")
    ties = [a for a in choice.alternatives if a.iteration_s == choice.chosen.iteration_s]
    assert len(ties) > 1 and f"tied with {len(ties) - 1} others" in lines[0]
    assert sum(line.startswith("   = ") for line in lines) == len(ties)
    described = plan.describe(config).splitlines()
    assert described[:len(lines)] == lines  # printed with the plan, once
    saved = plan.to_checkpoint()["encoder_schedule"]
    assert saved["encoder_schedule"] == choice.chosen.schedule
    assert len(saved["auto"]["alternatives"]) == len(choice.alternatives)


def test_auto_with_an_encoder_tp_of_its_own_leaves_megatron_out(capsys):
    config, plan = plan_of(TINY_MODEL + PP2 + TP2 + AUTO +
                         ["--encoder-tensor-model-parallel-size", "1"], 4)
    assert plan.schedule.encoder_schedule in ("coarse", "bubble")
    assert plan.schedule.encoder_tensor_model_parallel_size == 1
    assert {a.encoder_tensor_model_parallel_size for a in plan.schedule.auto.alternatives} \
        == {1}
    assert "megatron" not in {a.schedule for a in plan.schedule.auto.alternatives}
    with pytest.raises(SystemExit):
        parse_args(TINY_MODEL + PP2 + TP2 + ["--encoder-tensor-model-parallel-size", "1",
                                             "--pipeline-partition", "search"] + AUTO,
                   world_size=4)
    assert "--encoder-schedule auto has nothing to choose from" in capsys.readouterr().err


def test_auto_picks_the_encoder_tp_whose_all_reduces_cost_least(tmp_path):
    """TP 2 on slow links: auto runs the ViT at TP 1 (two replicas), the fastest of what it
    simulated; on the default links (NVLink) and measured compute it keeps TP 2."""
    argv = TINY_MODEL + PP2 + TP2 + AUTO
    profile = ["--pipeline-profile", slow_link_profile(argv, 4, tmp_path / "p.json")]
    config, plan = plan_of(argv + profile, 4)
    auto = plan.schedule.auto
    tps = {a.encoder_tensor_model_parallel_size for a in auto.alternatives
           if a.schedule != "megatron"}
    assert tps == {1, 2}
    assert auto.chosen.iteration_s == min(a.iteration_s for a in auto.alternatives)
    assert plan.schedule.encoder_tensor_model_parallel_size == 1
    assert plan.run_config(config).encoder_schedule.encoder_tensor_model_parallel_size == 1
    best_tp2 = min(a.iteration_s for a in auto.alternatives
                   if a.encoder_tensor_model_parallel_size in (None, 2))
    assert auto.chosen.iteration_s < best_tp2
    assert " TP 1, " in auto.lines()[0]
    assert "vision layers at TP 1: 2 replicas per TP group of 2" in plan.describe(config)
    # the default links (NVLink) cost the measured compute's ViT little: TP 2 or megatron
    _, fast = plan_of(argv + ["--pipeline-profile", slow_link_profile(
        argv, 4, tmp_path / "fast.json", slow=False)], 4)
    assert fast.schedule.auto.chosen.encoder_tensor_model_parallel_size in (None, 2)
    # with SP an encoder TP below TP is refused for the encoder pipelines: auto keeps them
    # to TP 2 (encoder ranks of their own may still run at TP 1)
    _, sp = plan_of(argv + profile + ["--sequence-parallel"], 4)
    assert {a.encoder_tensor_model_parallel_size for a in sp.schedule.auto.alternatives
            if a.schedule != "separate"} == {None, 2}


def test_auto_plans_vision_and_audio_together():
    from audio_data import AUDIO_MODEL

    config, plan = plan_of(TINY_MODEL + AUDIO_MODEL + PP2 + AUTO, 2)
    choice = plan.schedule.auto
    assert {a.schedule for a in choice.alternatives} == {"megatron", "coarse", "bubble",
                                                         "separate"}
    assert choice.chosen.iteration_s == min(a.iteration_s for a in choice.alternatives)
    assert plan.run_config(config).encoder_schedule.encoder_schedule == choice.chosen.schedule


def separate_alternatives(plan):
    return {(a.encoder_tensor_model_parallel_size, a.encoder_data_parallel_size,
             a.pipeline_model_parallel_size, a.data_parallel_size)
            for a in plan.schedule.auto.alternatives if a.schedule == "separate"}


def test_auto_offers_separate_on_the_same_world():
    """Each encoder rank count the world allows, the LLM at the flags' PP where the ranks
    left divide by it, else at a divisor below; the global batch must divide."""
    # 2 ranks at PP 2: 1 encoder rank, the LLM at PP 1 on the other
    _, plan = plan_of(TINY_MODEL + PP2 + AUTO, 2)
    assert separate_alternatives(plan) == {(1, 1, 1, 1)}
    sep = next(a for a in plan.schedule.auto.alternatives if a.schedule == "separate")
    assert sep.describe() == "separate, 1 encoder rank (TP 1 x DP 1), LLM PP 1 DP 1"
    # 4 ranks at PP 2: 1 encoder rank leaves 3 (PP 1 x DP 3: 8 samples do not divide by 2 x
    # 3), 2 leave PP 2 x DP 1, 3 leave PP 1
    _, plan = plan_of(TINY_MODEL + PP2 + AUTO, 4)
    assert separate_alternatives(plan) == {(1, 2, 2, 1), (1, 3, 1, 1)}
    assert "separate, 2 encoder ranks (TP 1 x DP 2), LLM PP 2 DP 1" in [
        a.describe() for a in plan.schedule.auto.alternatives]
    # what separate refuses is not offered: an encoder PP forced by the flags
    _, plan = plan_of(TINY_MODEL + PP2 + AUTO + ["--encoder-pipeline-model-parallel-size",
                                                  "1"], 2)
    assert separate_alternatives(plan) == set()
    assert plan.schedule.encoder_schedule != "separate"


def test_auto_chooses_separate_where_it_simulates_fastest(tmp_path):
    """A frozen ViT whose forward matches the LLM's work (20 ms layers; a 10 ms output
    layer), which no split of whole layers over PP 2 balances: on 2 ranks the encoder on
    one and the LLM on the other is fastest. The run is the separate placement at those
    sizes (its flags, groups and plan); a light ViT keeps a colocated schedule."""
    argv = TINY_MODEL + PP2 + AUTO + ["--freeze-ViT"]
    heavy = ["--pipeline-profile", separate_profile(argv, 2, tmp_path / "h.json", 20, 10)]
    config, plan = plan_of(argv + heavy, 2)
    auto = plan.schedule.auto
    assert auto.chosen.describe() == "separate, 1 encoder rank (TP 1 x DP 1), LLM PP 1 DP 1"
    assert auto.chosen.iteration_s == min(a.iteration_s for a in auto.alternatives)
    # by hand: the first encoder output after 1 + 2 x 20 ms, then the LLM's 4 micro-batches
    # back to back on its one stage (14 ms forward, 28 ms backward; each next output ready
    # before its forward): 41 + 4 x 42 ms
    assert auto.chosen.iteration_s == pytest.approx(0.209, rel=1e-3)
    run = plan.run_config(config)
    assert run.encoder_schedule.encoder_schedule == "separate"
    assert (run.encoder_schedule.encoder_tensor_model_parallel_size,
            run.encoder_schedule.encoder_data_parallel_size,
            run.parallel.pipeline_model_parallel_size, run.parallel.data_parallel_size,
            run.parallel.world_size, run.training.num_microbatches) == (1, 1, 1, 1, 1, 4)
    assert plan.separate is not None and plan.partition.pipeline_model_parallel_size == 1
    assert plan.separate_trainable == [False]
    assert plan.describe(config).splitlines()[0].startswith(
        "> --encoder-schedule auto chose separate, 1 encoder rank")
    assert plan.to_checkpoint()["encoder_schedule"]["encoder_schedule"] == "separate"
    # a light ViT: a colocated schedule, separate among the alternatives
    light = ["--pipeline-profile", separate_profile(argv, 2, tmp_path / "l.json", 5, 3)]
    _, plan = plan_of(argv + light, 2)
    assert plan.schedule.encoder_schedule != "separate"
    assert separate_alternatives(plan) == {(1, 1, 1, 1)}


def test_the_run_orders_its_encoder_actions_as_auto_simulated(tmp_path):
    """Vision and audio sharing one encoder rank, the audio layers 30x the rest: the run's
    program (``separate_run.separate_program``) orders the encoder rank's actions on the
    same costs as the simulation ``auto`` compares (unit costs would order them otherwise),
    so its simulated iteration is the one ``auto`` saw."""
    from audio_data import AUDIO_MODEL

    from megatron_mm.plan.pipeline.profile import LayerProfile, LayerTime
    from megatron_mm.plan.schedules.separate import separate
    from megatron_mm.plan.schedules.separate_costs import separate_iteration_s
    from megatron_mm.training.planning.separate_auto import (separate_iteration,
                                                             separate_program_costs)
    from megatron_mm.training.separate.run import separate_program
    from megatron_mm.training.assembly.separate_world import separate_ranks

    argv = TINY_MODEL + AUDIO_MODEL + ["--encoder-schedule", "separate", "--micro-batch-size",
                                       "2", "--global-batch-size", "16"]
    config, plan = plan_of(argv, 2)
    ms = lambda l: 30 if l.kind == "audio_layer" else 1  # noqa: E731
    LayerProfile("test", 2, config.model.seq_length, 1, [], [
        LayerTime(l.module, ms(l) * 1e-3, 2 * ms(l) * 1e-3 if l.runs_backward else 0.0)
        for l in plan.chain]).save(str(tmp_path / "p.json"))
    config, plan = plan_of(argv + ["--pipeline-profile", str(tmp_path / "p.json")], 2)
    sizes = separate_ranks(config.parallel, config.encoder_schedule, 2).sizes
    n = config.training.num_microbatches
    program = separate_program(config, plan, sizes)(n)
    costs = separate_program_costs(config, plan.chain, plan.partition, 1, 1)
    assert separate_iteration_s(program, costs) == pytest.approx(
        separate_iteration(config, plan.chain))
    unit = separate(ScheduleProblem(1, n, llm_data_parallel_size=1, encoder_data_parallel_size=1,
                                    encoders=2))
    assert program.ranks[:-1] == unit.ranks[:-1] and program.ranks[-1] != unit.ranks[-1]


def test_auto_offers_the_encoder_interleaved_where_it_has_the_layers():
    config, plan = plan_of(TINY_MODEL + PP2 + AUTO + ["--vision-num-layers", "4"], 2)
    interleaved = [a for a in plan.schedule.auto.alternatives
                   if a.encoder_virtual_pipeline_model_parallel_size == 2]
    assert {(a.schedule, a.encoder_pipeline_model_parallel_size, a.encoder_pieces)
            for a in interleaved} == {("coarse", 2, 1), ("bubble", 2, 1)}
    assert "bubble, encoder PP 2 VPP 2, 1 piece(s) per stage" in [
        a.describe() for a in interleaved]
    # the flag given: auto keeps to it
    config, plan = plan_of(TINY_MODEL + PP2 + AUTO + [
        "--vision-num-layers", "4", "--encoder-virtual-pipeline-model-parallel-size", "2"], 2)
    assert {a.encoder_virtual_pipeline_model_parallel_size for a in
            plan.schedule.auto.alternatives if a.schedule in ("coarse", "bubble")} == {2}


def test_bubble_plan_names_each_llm_chunk():
    """The LLM chunks by their contents, the embedding and output named, not counted."""
    config, plan = plan_of(TINY_MODEL + PP2 + ["--encoder-schedule", "bubble"], 2)
    first = plan.describe(config).splitlines()[0]
    assert first.startswith("> encoder schedule bubble: LLM chunks embedding + 1 layer | "
                            "1 layer + output (uniform); vision trainable, 2 pieces"), first
