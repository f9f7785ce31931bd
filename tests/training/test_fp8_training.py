"""FP8 emulation in training: TP=2 equals TP=1. Delayed scaling reduces every amax over
the TP group, so each TP rank quantises its shard with the whole tensor's scale: the same
FP8 values as one process, up to fp32 summation order in the GEMMs."""

import pytest
import torch
from dist_harness import run_distributed
from train_workers import TINY_MODEL, train

pytestmark = pytest.mark.processes

STEPS = 1
FP8 = ["--fp8-format", "hybrid", "--fp8-emulation", "--fp8-modules", "llm,vision-projector",
       "--fp8-amax-history-len", "4", "--fp8-amax-compute-algo", "max"]


def _argv(data, tp):
    return TINY_MODEL + FP8 + [
        "--data-path", data, "--train-iters", str(STEPS), "--micro-batch-size", "4",
        "--global-batch-size", "8", "--make-vocab-size-divisible-by", str(256 // tp),
        "--tensor-model-parallel-size", str(tp)]


def test_fp8_emulation_tensor_parallel_2_equals_1(digits_dir):
    ref = run_distributed(train, 1, _argv(digits_dir, 1), (1, STEPS))[0]
    ours = run_distributed(train, 2, _argv(digits_dir, 2), (1, STEPS))[0]
    for it in range(1, STEPS + 1):
        assert ours["losses"][it] == pytest.approx(ref["losses"][it], rel=1e-5), it
    for it in (1, STEPS):
        for name, g in ref["grads"][it].items():
            if g is not None:
                torch.testing.assert_close(ours["grads"][it][name], g, rtol=1e-4, atol=1e-6,
                                           msg=lambda m: f"grad {name} at step {it}: {m}")
