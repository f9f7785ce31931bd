"""--check-for-nan-in-loss-and-grad without a pass over the gradients or a host read of
its own: on an iteration that is not a log interval, the training loop's work outside the
schedule (``test_host_syncs.py``) and outside Megatron-Core's optimizer step (the
gradient norm it computes anyway, the clip, the update) reads nothing on the host and
allocates nothing the size of the gradients; it still stops on a NaN gradient before the
update, and on a NaN loss at the next log interval, every rank with the same message."""

import functools
import math

import pytest
import torch
from dist_harness import run_distributed
from host_syncs import HostSyncCounter
from train_workers import TINY_MODEL, train

pytestmark = pytest.mark.processes

STEPS = ["--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "4",
         "--log-interval", "2", "--eval-iters", "0"]


def _argv(digits_dir, *extra):  # later flags win: --log-interval 2
    return TINY_MODEL + ["--data-path", digits_dir, *STEPS, *extra]


def _count_the_loop(chunks, optimizer, holder):
    """Count host syncs in each iteration's loop work: ``train_step``, the log line and
    the summary, leaving out the schedule and Megatron-Core's optimizer internals."""
    import megatron.core.optimizer.optimizer as mcore_optimizer
    from megatron.core.optimizer import ChainedOptimizer

    from megatron_mm.training.loop import step, trainer, training_log

    counter = HostSyncCounter()
    found = holder["found"] = {}  # iteration -> host syncs
    holder["largest"] = counter.stats
    holder["grad_elements"] = sum(p.numel() for c in chunks for p in c.parameters()
                                  if p.requires_grad)

    def paused(fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with counter.pause():
                return fn(*args, **kwargs)
        return wrapped

    def counted(fn, iteration_of):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            before = len(counter.found)
            with counter.active():
                out = fn(*args, **kwargs)
            it = iteration_of(args, kwargs)
            found.setdefault(it, []).extend(counter.found[before:])
            return out
        return wrapped

    step.run_schedule = paused(step.run_schedule)
    for name in ("prepare_grads", "get_grad_norm", "_compute_grad_norms_by_group",
                 "step_with_ready_grads"):
        setattr(ChainedOptimizer, name, paused(getattr(ChainedOptimizer, name)))
    mcore_optimizer.clip_grad_by_total_norm_fp32 = paused(
        mcore_optimizer.clip_grad_by_total_norm_fp32)
    trainer.train_step = counted(trainer.train_step, lambda a, k: k["iteration"])
    log = training_log.TrainingLog
    log.record = counted(log.record, lambda a, k: a[1])
    last = [0]
    take_read = trainer.Trainer.take_read

    def take(self, read):  # what the iteration's log line read, into the summary
        last[0] += 1
        return counted(take_read, lambda a, k: last[0])(self, read)
    trainer.Trainer.take_read = take


def _beyond_the_norm(found: list) -> list:
    """``found`` but the check's read of the gradient norm: a device scalar only when
    Megatron-Core computes it with TE (``nan_check.py``), at most once per iteration."""
    norm = [f for f in found if f[1].startswith("training/nan_check.py")
            and "float(norm)" in f[1]]
    assert len(norm) <= 1, norm
    return [f for f in found if f not in norm]


def test_no_host_read_or_gradient_sized_temporary_between_log_intervals(digits_dir):
    out = run_distributed(train, 1, _argv(digits_dir), (), _count_the_loop)[0]
    seen = out["observed"]
    for it in (1, 3):  # not log intervals
        assert _beyond_the_norm(seen["found"][it]) == [], (it, seen["found"][it])
    assert 0 < seen["largest"]["largest"] < seen["grad_elements"]
    assert sorted(seen["found"]) == [1, 2, 3, 4, 5]  # it did look (5: the final read)
    assert seen["found"][2], "the log interval reads the loss"
    assert all(math.isfinite(out["losses"][it]) for it in (1, 2, 3, 4))


def train_with_nan(rank, argv, grad_at, loss_at):
    """``train``, with a NaN put into one LLM gradient at iteration ``grad_at`` or into the
    reported loss (not the gradients) at iteration ``loss_at``; returns the error and
    whether the parameters stayed finite."""
    from megatron_mm.training.loop import step
    from megatron_mm.training.loop.nan_check import NonFiniteError

    holder = {}

    def hooks(model, optimizer, observed):
        holder["model"] = model
        name, param = next((n, p) for n, p in model[0].named_parameters()
                           if "linear_fc1.weight" in n)
        backwards = [0]

        def poison(grad):
            backwards[0] += 1  # two micro-batches per iteration
            return grad * float("nan") if (backwards[0] + 1) // 2 == grad_at else grad
        param.register_hook(poison)

    real, calls = step.loss_func, [0]

    def loss_func(loss_mask, output):
        loss, tokens, report = real(loss_mask, output)
        calls[0] += 1
        if (calls[0] + 1) // 2 == loss_at:
            report = {"lm loss": report["lm loss"] * float("nan")}
        return loss, tokens, report
    step.loss_func = loss_func
    try:
        train(rank, argv, hooks=hooks)
    except NonFiniteError as e:
        finite = all(bool(torch.isfinite(p).all()) for c in holder["model"]
                     for p in c.parameters())
        return str(e), finite
    return "no error", None


def test_a_nan_gradient_stops_before_the_update(digits_dir):
    (message, finite), = run_distributed(train_with_nan, 1, _argv(digits_dir), 3, None)
    assert message.startswith("iteration 3: found NaN or Inf in the gradients"), message
    assert finite  # the optimizer applied nothing


def test_a_nan_loss_stops_every_rank_at_the_log_interval(digits_dir):
    out = run_distributed(train_with_nan, 2, _argv(
        digits_dir, "--pipeline-model-parallel-size", "2"), None, 3)
    for message, finite in out:  # both stages stop, the first included
        assert message.startswith("iteration 3: found NaN or Inf in the loss"), message
        assert finite
