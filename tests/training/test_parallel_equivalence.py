"""TP=2 and DP=2 runs of the training script equal the single-process reference:
losses at every step and gradients / parameters at fp32 tolerance."""

import pytest
import torch
from dist_harness import run_distributed
from train_workers import TINY_MODEL, train

pytestmark = pytest.mark.processes

STEPS = 3


def _argv(data, *extra):
    # Megatron pads the vocabulary to a multiple of 128 x TP and the padded rows enter the
    # softmax: pin one padded size (32256) for every TP so the runs are comparable.
    tp = int(extra[extra.index("--tensor-model-parallel-size") + 1]) if (
        "--tensor-model-parallel-size" in extra) else 1
    return TINY_MODEL + ["--data-path", data, "--train-iters", str(STEPS),
                         "--make-vocab-size-divisible-by", str(256 // tp), *extra]


@pytest.fixture(scope="module")
def reference(digits_dir):
    # One process, global batch 8 in two micro-batches of 4 (the DP=2 split of the batch).
    argv = _argv(digits_dir, "--micro-batch-size", "4", "--global-batch-size", "8")
    return run_distributed(train, 1, argv, (1, STEPS))[0]


def _assert_close(ours, ref, what, rtol=1e-4, atol=1e-6):
    # Parameters get atol 1e-5 (1% of the learning rate): Adam turns fp32 rounding noise in
    # near-zero gradients into updates of up to lr.
    assert ours.keys() == ref.keys()
    for name in ref:
        if ref[name] is None:
            assert ours[name] is None, f"{what} {name}: frozen in the reference only"
            continue
        torch.testing.assert_close(ours[name], ref[name], rtol=rtol, atol=atol,
                                   msg=lambda m: f"{what} {name}: {m}")


def _assert_losses(ours, ref):
    for it in range(1, STEPS + 1):
        assert ours["losses"][it] == pytest.approx(ref["losses"][it], rel=1e-5), it


def test_tensor_parallel_2_equals_1(digits_dir, reference):
    argv = _argv(digits_dir, "--micro-batch-size", "4", "--global-batch-size", "8",
                 "--tensor-model-parallel-size", "2")
    ranks = run_distributed(train, 2, argv, (1, STEPS))
    ours = ranks[0]
    _assert_losses(ours, reference)
    assert ranks[1]["losses"] == ours["losses"]  # both TP ranks see the same loss
    for it in (1, STEPS):
        _assert_close(ours["grads"][it], reference["grads"][it], f"grad at step {it}")
    _assert_close(ours["params"], reference["params"], "param after training", atol=1e-5)


@pytest.mark.parametrize("distributed_optimizer", [False, True])
def test_data_parallel_2_equals_1(digits_dir, reference, distributed_optimizer):
    extra = ["--use-distributed-optimizer"] if distributed_optimizer else []
    argv = _argv(digits_dir, "--micro-batch-size", "2", "--global-batch-size", "8", *extra)
    ranks = run_distributed(train, 2, argv)
    _assert_losses(ranks[0], reference)
    _assert_close(ranks[0]["params"], reference["params"], "param after training", atol=1e-5)
    _assert_close(ranks[1]["params"], ranks[0]["params"], "DP replicas", rtol=0, atol=0)
