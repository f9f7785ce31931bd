"""Which pipeline stages are sent the media contents when the first TP rank broadcasts
the micro-batch (``data_setup.stage_reads_media``): where a chunk embeds an encoder's
input (Megatron-Core's schedules), or where the schedule executor runs an encoder's first
piece (--encoder-schedule coarse | bubble, the ViT's first stage on either end); the
others are sent only the contents' shapes."""

import pytest
from plans import plan_of
from train_workers import TINY_MODEL

from megatron_mm.training.assembly.data_setup import stage_reads_media
from megatron_mm.training.loop.encoder_executor import build_executor

ARGV = TINY_MODEL + ["--micro-batch-size", "1", "--global-batch-size", "4",
                     "--pipeline-model-parallel-size", "2", "--train-iters", "1"]


def executor_embeds(config, plan) -> set:
    """The pipeline ranks whose actions include an encoder's first piece (the one that
    reads the media contents, ``executor.run_EF``)."""
    run = build_executor(config, plan.encoder_plan, plan.chain)
    first = {min(i for i, (n, _) in enumerate(run.pieces) if n == name)
             for name, _ in run.pieces}
    schedule = run.schedule(4)
    return {r for r, actions in enumerate(schedule.ranks)
            for a in actions if a.kind == "EF" and a.chunk in first}


@pytest.mark.parametrize("flags, reads", [
    ([], [True, False]),  # uniform: the encoders on stage 0
    (["--pipeline-partition", "3,5"], [True, False]),  # the ViT cut after its first layer
    (["--pipeline-partition", "1,7"], [False, True]),  # the ViT's embedding on stage 1
    (["--encoder-schedule", "coarse"], None),
    (["--encoder-schedule", "bubble", "--encoder-placement", "last"], None),
    (["--encoder-schedule", "bubble", "--encoder-placement", "first"], None),
])
def test_the_stages_that_read_media(digits_dir, flags, reads):
    config, plan = plan_of(ARGV + ["--data-path", digits_dir] + flags, 2)
    got = [stage_reads_media(plan, r) for r in range(2)]
    if reads is None:  # the executor's own say
        embeds = executor_embeds(config, plan)
        assert len(embeds) == 1, embeds
        reads = [r in embeds for r in range(2)]
    assert got == reads, (plan.describe(config), got)
