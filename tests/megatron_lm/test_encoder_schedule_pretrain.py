"""Megatron-LM's own ``megatron.training.pretrain`` (the wheel's) with the package's
provider, forward step and data (``examples/megatron_lm/pretrain_vlm.py``) and
``use_encoder_schedule()``: PP=2 with ``--encoder-schedule bubble`` (the ViT split over the
two ranks, its pieces in the LLM's bubbles) runs through Megatron-LM's ``train_step`` and
equals ``examples/pretrain_mllm.py`` with the same flags from the same initial checkpoint,
losses and gradient norms."""

import pytest
from balanced_runs import small_digits
from dist_harness import run_distributed
from encoder_schedule_runs import pretrain_with_encoder_schedule
from megatron_lm_runs import megatron_lm_flags, ours_flags

pytestmark = [pytest.mark.processes, pytest.mark.slow]

BUBBLE = ["--pipeline-model-parallel-size", "2", "--encoder-schedule", "bubble"]


def test_pp2_bubble_through_megatron_lm_equals_pretrain_mllm(digits_dir, tmp_path):
    data = ["--data-path", small_digits(digits_dir, str(tmp_path / "digits"), n=64)]
    init = str(tmp_path / "init")
    from_init = [*data, "--train-iters", "3", "--load", init, "--no-load-optim",
                 "--no-load-rng", *BUBBLE]
    steps = [("ours", ours_flags(*data, "--train-iters", "0", "--save", init)),
             ("ours", ours_flags(*from_init)), ("megatron_lm", megatron_lm_flags(*from_init))]
    ranks = run_distributed(pretrain_with_encoder_schedule, 2, steps)
    last = ranks[-1]  # the last pipeline stage reports the loss
    ours, theirs = last[1], last[2]
    for key in ("losses", "grad_norms"):
        assert list(theirs[key]) == [1, 2, 3], (key, theirs[key])
        for it in (1, 2, 3):
            assert theirs[key][it] == pytest.approx(ours[key][it], rel=1e-5, abs=1e-6), (key, it)
    for rank in ranks:  # every iteration of Megatron-LM's loop ran the bubble schedule
        assert rank[-1] == {"calls": 3, "executor": "ScheduleExecutor"}, rank[-1]
