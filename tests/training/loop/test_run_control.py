"""Megatron-LM's run control: --eval-iters 0, --exit-interval, --exit-duration-in-mins,
--exit-signal-handler, --check-for-nan-in-loss-and-grad, --tensorboard-dir and --wandb-*,
on the training script's loop.

One uninterrupted reference run (DP=2) serves every comparison: a run stopped by
--exit-interval or by SIGTERM, then resumed, must give its losses exactly."""

import os
import signal

import pytest
from dist_harness import run_distributed
from train_workers import TINY_MODEL, train

ITERS = 6


def _argv(digits_dir, *extra):
    base = [a for a in TINY_MODEL if a != "--skip-final-eval"]
    return base + ["--data-path", digits_dir, "--micro-batch-size", "2",
                   "--global-batch-size", "4", "--hidden-dropout", "0.1",
                   "--train-iters", str(ITERS), *extra]


@pytest.fixture(scope="module")
def reference(digits_dir, tmp_path_factory):
    """Six iterations, no validation (--eval-iters 0), TensorBoard events written."""
    tb = str(tmp_path_factory.mktemp("tb_reference"))
    out = run_distributed(train, 2, _argv(digits_dir, "--eval-iters", "0",
                                          "--tensorboard-dir", tb))
    return {"summary": out[-1], "tensorboard": tb}


def _scalars(directory):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(directory, size_guidance={"scalars": 0})
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)}
            for tag in events.Tags()["scalars"]}


@pytest.mark.processes
def test_eval_iters_0_runs_no_validation(reference):
    summary = reference["summary"]
    assert list(summary["losses"]) == list(range(1, ITERS + 1))
    assert "val_loss" not in summary and "val_accuracy" not in summary
    assert "lm loss validation" not in _scalars(reference["tensorboard"])


@pytest.mark.processes
def test_tensorboard_holds_the_logged_scalars(reference):
    scalars = _scalars(reference["tensorboard"])
    for tag in ("lm loss", "learning-rate", "grad-norm", "batch-size", "loss-scale",
                "lm loss vs samples"):
        assert tag in scalars, sorted(scalars)
    summary = reference["summary"]
    assert sorted(scalars["lm loss"]) == list(range(1, ITERS + 1))
    for it, loss in summary["losses"].items():
        assert scalars["lm loss"][it] == pytest.approx(loss, rel=1e-6)
        assert scalars["grad-norm"][it] == pytest.approx(summary["grad_norms"][it], rel=1e-6)
    assert sorted(scalars["lm loss vs samples"]) == [4 * it for it in range(1, ITERS + 1)]


def train_signalled(rank, argv, at):
    """SIGTERM reaches rank 0 only, during iteration ``at``'s callback: the other rank
    must stop after the same iteration (the ranks agree), with one checkpoint."""
    from megatron_mm.training.cli.arguments import parse_args
    from megatron_mm.training.pretrain import pretrain
    from megatron_mm.training.config.run_config import RunConfig
    from megatron_mm.training.loop.trainer import TrainingCallbacks

    def on_step(iteration, model, loss):
        if iteration == at and rank == 0:
            os.kill(os.getpid(), signal.SIGTERM)

    args = parse_args(argv, world_size=int(os.environ["WORLD_SIZE"]))
    summary = pretrain(RunConfig.from_flags(args), TrainingCallbacks(on_step=on_step))
    return {k: summary.get(k) for k in ("losses", "iteration", "exit")}


@pytest.fixture(scope="module")
def sigterm_stop(digits_dir, tmp_path_factory):
    """The run stopped by SIGTERM after iteration 2 and the directory it saved to."""
    save = str(tmp_path_factory.mktemp("sigterm") / "ckpt")
    stopped = run_distributed(train_signalled, 2, _argv(digits_dir, "--eval-iters", "0",
                                                        "--save", save,
                                                        "--exit-signal-handler"), 2)
    return stopped, save


@pytest.mark.processes
def test_sigterm_saves_one_checkpoint_on_every_rank(reference, sigterm_stop):
    stopped, save = sigterm_stop
    assert [out["iteration"] for out in stopped] == [2, 2]
    assert all("SIGTERM" in out["exit"] for out in stopped)
    assert sorted(os.listdir(save)) == ["iter_0000002", "latest_checkpointed_iteration.txt"]
    full = reference["summary"]["losses"]
    for it in (1, 2):
        assert stopped[-1]["losses"][it] == full[it], it


@pytest.mark.processes
def test_resume_then_exit_interval_then_resume_gives_the_same_losses(reference, sigterm_stop,
                                                                     digits_dir, tmp_path):
    """The SIGTERM checkpoint resumed and stopped by --exit-interval, then resumed again:
    each resume gives the uninterrupted run's losses."""
    save = str(tmp_path / "ckpt")
    stopped = run_distributed(train, 2, _argv(digits_dir, "--eval-iters", "0",
                                              "--load", sigterm_stop[1],
                                              "--exit-interval", "4", "--save", save))[-1]
    assert stopped["iteration"] == 4 and "exit-interval" in stopped["exit"]
    assert open(os.path.join(save, "latest_checkpointed_iteration.txt")).read() == "4"
    # The resumed run validates at the end: its scalars reach TensorBoard too.
    tb = str(tmp_path / "tb")
    resumed = run_distributed(train, 2, _argv(digits_dir, "--eval-iters", "1", "--load", save,
                                              "--tensorboard-dir", tb))[-1]
    assert list(stopped["losses"]) == [3, 4] and list(resumed["losses"]) == [5, 6]
    full = reference["summary"]["losses"]
    for it in (3, 4):
        assert stopped["losses"][it] == full[it], it
    for it in (5, 6):
        assert resumed["losses"][it] == full[it], it
    scalars = _scalars(tb)
    assert scalars["lm loss validation"] == {6: pytest.approx(resumed["val_loss"], rel=1e-6)}
    assert scalars["val answer accuracy"] == {6: pytest.approx(resumed["val_accuracy"])}


def train_with_nan_grad(rank, argv, at):
    """A NaN put into one gradient of rank 1 at iteration ``at``."""
    from megatron_mm.training.loop.nan_check import NonFiniteError

    def hooks(model, optimizer, holder):
        name, param = next((n, p) for n, p in model[0].named_parameters()
                           if "language_model" in n and "linear_fc1.weight" in n)
        calls = [0]

        def poison(grad):
            calls[0] += 1  # one backward per iteration (one micro-batch per step)
            return grad * float("nan") if calls[0] == at and rank == 1 else grad
        param.register_hook(poison)

    try:
        train(rank, argv, hooks=hooks)
    except NonFiniteError as e:
        return str(e)
    return "no error"


@pytest.mark.processes
def test_a_nan_gradient_stops_the_run_naming_the_iteration(digits_dir):
    out = run_distributed(train_with_nan_grad, 2,
                          _argv(digits_dir, "--eval-iters", "0", "--train-iters", "4"), 3)
    for message in out:  # every rank stops, with the same message
        assert message.startswith("iteration 3: found NaN or Inf in the gradients"), message


def test_missing_optional_logging_packages_are_named(monkeypatch, tmp_path):
    import sys

    from megatron_mm.config import ConfigError
    from megatron_mm.training.loop.metric_writers import build_writers
    from megatron_mm.training.cli.arguments import parse_run_config

    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    config = parse_run_config(["--wandb-project", "p", "--wandb-exp-name", "e",
                               "--wandb-save-dir", str(tmp_path)], world_size=1)
    with pytest.raises(ConfigError, match="--wandb-project needs the wandb package"):
        build_writers(config)
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    config = parse_run_config(["--tensorboard-dir", "tb"], world_size=1)
    with pytest.raises(ConfigError, match="--tensorboard-dir needs the tensorboard package"):
        build_writers(config)


def train_wandb_offline(rank, argv):
    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true")  # no network
    return train(rank, argv)


@pytest.mark.processes
def test_wandb_offline_writes_the_scalars(digits_dir, tmp_path):
    pytest.importorskip("wandb")  # optional: pip install wandb
    save_dir = tmp_path / "wandb"
    run_distributed(train_wandb_offline, 1, _argv(digits_dir, "--eval-iters", "0",
                                                  "--train-iters", "2",
                                                  "--wandb-project", "megatron-mm-test",
                                                  "--wandb-exp-name", "offline",
                                                  "--wandb-save-dir", str(save_dir)))
    runs = list(save_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(runs) == 1, list(save_dir.rglob("*"))
    records = runs[0].read_bytes()  # protobuf records: the scalar names are in the clear
    for name in (b"lm loss", b"learning-rate", b"grad-norm"):
        assert name in records, name


def train_late(rank, argv, at):
    """Rank 0's clock jumps two minutes ahead after iteration ``at``: with
    --exit-duration-in-mins 1 every rank stops after that iteration (they agree)."""
    import time as real_time

    from megatron_mm.training.loop import trainer

    class Clock:
        offset = 0.0

        def time(self):
            return real_time.time() + self.offset

    clock = trainer.time = Clock()

    from megatron_mm.training.cli.arguments import parse_args
    from megatron_mm.training.pretrain import pretrain
    from megatron_mm.training.config.run_config import RunConfig
    from megatron_mm.training.loop.trainer import TrainingCallbacks

    def on_step(iteration, model, loss):
        if iteration == at and rank == 0:
            clock.offset = 120.0

    args = parse_args(argv, world_size=int(os.environ["WORLD_SIZE"]))
    summary = pretrain(RunConfig.from_flags(args), TrainingCallbacks(on_step=on_step))
    return {k: summary.get(k) for k in ("iteration", "exit")}


@pytest.mark.processes
def test_exit_duration_stops_every_rank_after_the_same_iteration(digits_dir, tmp_path):
    save = str(tmp_path / "ckpt")
    out = run_distributed(train_late, 2, _argv(digits_dir, "--eval-iters", "0", "--save", save,
                                               "--exit-duration-in-mins", "1"), 2)
    assert [o["iteration"] for o in out] == [2, 2]
    assert all("minutes" in o["exit"] for o in out)
    assert open(os.path.join(save, "latest_checkpointed_iteration.txt")).read() == "2"
