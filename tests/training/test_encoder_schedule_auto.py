"""--encoder-schedule auto: the planner simulates megatron, coarse and bubble (each encoder
PP and piece count) on the run's own costs and the run takes the fastest. (That the chosen
run equals one process is test_pipeline_parallel's ``pp2-auto`` case.)"""

import pytest

from megatron_mm.plan.encoder_pipeline import megatron_costs
from megatron_mm.plan.generate import megatron
from megatron_mm.plan.hardware import Hardware
from megatron_mm.plan.partition import partition
from megatron_mm.plan.simulate import simulate
from megatron_mm.training.arguments import parse_args
from megatron_mm.training.encoder_schedule_auto import _chain

from train_workers import TINY_MODEL

PP2 = ["--pipeline-model-parallel-size", "2", "--micro-batch-size", "2",
       "--global-batch-size", "8"]


def test_auto_takes_the_fastest_simulated_alternative():
    args = parse_args(TINY_MODEL + PP2 + ["--encoder-schedule", "auto"], world_size=2)
    choice = args.encoder_schedule_auto
    kinds = {(a.schedule, a.encoder_pipeline_model_parallel_size, a.encoder_pieces)
             for a in choice.alternatives}
    # a 2-layer ViT: 1 or 2 stages, pieces that fit its layers
    assert kinds == {("megatron", None, 1)} | {(k, s, p) for k in ("coarse", "bubble")
                                               for s, p in ((1, 1), (1, 2), (2, 1))}
    assert choice.chosen.iteration_s == min(a.iteration_s for a in choice.alternatives)
    assert args.encoder_schedule == choice.chosen.schedule
    if choice.chosen.schedule != "megatron":
        assert (args.encoder_pipeline_model_parallel_size, args.encoder_pieces) == (
            choice.chosen.encoder_pipeline_model_parallel_size, choice.chosen.encoder_pieces)
    # the megatron alternative is Megatron-Core's order on the partition the run would use
    chain = _chain(args)
    part = partition(chain, 2, 1, args.pipeline_partition, num_microbatches=4)
    expected = simulate(megatron(2, 1, 4), megatron_costs(chain, part, Hardware()), False)
    got = next(a for a in choice.alternatives if a.schedule == "megatron")
    assert got.iteration_s == pytest.approx(expected.iteration_s)
    lines = choice.lines()
    assert lines[0].startswith(f"> --encoder-schedule auto chose {choice.chosen.describe()}")
    assert len(lines) == 1 + len(choice.alternatives)


def test_auto_with_an_encoder_tp_of_its_own_leaves_megatron_out(capsys):
    args = parse_args(TINY_MODEL + PP2 + ["--tensor-model-parallel-size", "2",
                                          "--encoder-tensor-model-parallel-size", "1",
                                          "--encoder-schedule", "auto"], world_size=4)
    assert args.encoder_schedule in ("coarse", "bubble")
    assert "megatron" not in {a.schedule for a in args.encoder_schedule_auto.alternatives}
    with pytest.raises(SystemExit):
        parse_args(TINY_MODEL + PP2 + ["--tensor-model-parallel-size", "2",
                                       "--encoder-tensor-model-parallel-size", "1",
                                       "--pipeline-partition", "search",
                                       "--encoder-schedule", "auto"], world_size=4)
    assert "--encoder-schedule auto has nothing to choose from" in capsys.readouterr().err


def test_auto_plans_vision_and_audio_together():
    from audio_data import AUDIO_MODEL

    args = parse_args(TINY_MODEL + AUDIO_MODEL + PP2 + ["--encoder-schedule", "auto"],
                      world_size=2)
    choice = args.encoder_schedule_auto
    assert {a.schedule for a in choice.alternatives} == {"megatron", "coarse", "bubble"}
    assert choice.chosen.iteration_s == min(a.iteration_s for a in choice.alternatives)
    assert args.encoder_schedule == choice.chosen.schedule
