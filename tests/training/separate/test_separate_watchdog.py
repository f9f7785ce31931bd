"""``--encoder-schedule separate`` under NCCL's watchdog (``nccl_watchdog``: a Work not
finished within the timeout kills the rank, as ProcessGroupNCCL's abort does): the val
answer accuracy's greedy decoding is made slow (each decoding forward waits), its whole
share far longer than the timeout, and the run still trains on past it. Before the
protocol's host barriers the encoder rank returned from validation right after encoding
and posted the next step's exchange, which waited for the LLM's whole decode."""

import pytest
from dist_harness import run_distributed
from train_workers import TINY_MODEL, train

pytestmark = pytest.mark.processes

TIMEOUT_S = 3.0  # the emulated --distributed-timeout-minutes
TOKEN_S = 0.8  # each decoding forward's extra time, in the first validation only


def _slow_validation_under_watchdog(rank, argv):
    import time

    from megatron_mm.training.loop import evaluation, trainer
    from nccl_watchdog import emulate_nccl_watchdog

    accuracy, next_tokens = trainer.answer_accuracy, evaluation.next_tokens
    decoding = {"evaluations": 0, "seconds": 0.0}

    def slow_next_tokens(*args, **kwargs):
        if decoding["evaluations"] == 1:
            time.sleep(TOKEN_S)
        return next_tokens(*args, **kwargs)

    def first_slow(*args, **kwargs):
        decoding["evaluations"] += 1
        if decoding["evaluations"] == 1:  # from here on (start-up may wait longer)
            emulate_nccl_watchdog(TIMEOUT_S)
        start = time.monotonic()
        try:
            return accuracy(*args, **kwargs)
        finally:
            if decoding["evaluations"] == 1:
                decoding["seconds"] = time.monotonic() - start

    trainer.answer_accuracy, evaluation.next_tokens = first_slow, slow_next_tokens
    out = train(rank, argv)
    return {"losses": out["losses"], "decoding_s": decoding["seconds"]}


def test_slow_validation_decoding_holds_no_collective_past_the_watchdog(digits_dir):
    argv = TINY_MODEL + ["--data-path", digits_dir, "--micro-batch-size", "2",
                         "--global-batch-size", "4", "--train-iters", "2",
                         "--encoder-schedule", "separate", "--eval-interval", "1",
                         "--eval-iters", "2", "--eval-max-new-tokens", "2"]
    encoder, llm = run_distributed(_slow_validation_under_watchdog, 2, argv)
    assert list(llm["losses"]) == [1, 2]  # the step after the slow validation ran
    # the LLM's decoding of its share outlasted the timeout many times over
    assert llm["decoding_s"] > 2 * TIMEOUT_S
