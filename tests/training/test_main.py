"""The training script's ``main()`` owns how a job ends (``training/main.py``): a user's error
is one line without a traceback (exit 2), a peer's stop is silent (exit 1), anything else
is raised; the run's assembly before any process group is ``RunContext.build``'s."""

import pytest

from megatron_mm.config import ConfigError
from megatron_mm.training.cli.arguments import parse_run_config
from megatron_mm.training.main import main, run_job
from megatron_mm.training.run_context import RunContext


def _raise(error):
    def job():
        raise error
    return job


def test_a_users_error_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        run_job(_raise(ConfigError("--lr must be positive")))
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().endswith("error: --lr must be positive") and "Traceback" not in err


def test_a_peers_stop_is_silent_and_exit_1(capsys):
    with pytest.raises(SystemExit) as exit_:
        run_job(_raise(RuntimeError("[../gloo/transport/tcp/pair.cc] Connection closed by peer")))
    assert exit_.value.code == 1 and capsys.readouterr().err == ""
    with pytest.raises(RuntimeError, match="a bug"):  # anything else: its traceback
        run_job(_raise(RuntimeError("a bug")))
    assert run_job(lambda: 3) == 3


def test_main_reports_a_bad_flag_naming_it(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--micro-batch-size", "3", "--global-batch-size", "4"])
    assert exit_.value.code == 2 and "--global-batch-size" in capsys.readouterr().err


def test_run_context_holds_the_runs_assembly():
    config = parse_run_config(["--train-iters", "1"], 1)
    run = RunContext.build(config)
    assert run.model_config.language.vocab_size == run.tokenizer.vocab_size
    assert run.plan.placements and run.attention.context_parallel_size == 1
    assert run.config.encoder_schedule == config.encoder_schedule
