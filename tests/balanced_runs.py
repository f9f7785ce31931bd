"""Balanced (--data-balance) runs shared by the training tests: a small digits data set, and
DP=2 checked against one process trained on both DP ranks' packed micro-batches."""

import os

import pytest
from dist_harness import run_distributed
from train_workers import train


def small_digits(digits_dir, out, n=160):
    """The first ``n`` digits records (images inline; tokenizing all 1500 on every rank
    costs more than the training here)."""
    os.makedirs(out)
    for name in ("train.jsonl", "valid.jsonl"):
        with open(os.path.join(digits_dir, name)) as f:
            lines = f.readlines()[:n]
        with open(os.path.join(out, name), "w") as f:
            f.writelines(lines)
    return out


def train_on_both_ranks_plans(rank, argv, grad_steps):
    """One process that trains, each step, on both DP=2 ranks' packed micro-batches of the
    balanced plan (rank 0's, then rank 1's): what DP=2 computes together."""
    import megatron_mm.training.assembly.balanced_data as balanced

    real = balanced.BalancedSampler

    class BothRanks:
        def __init__(self, loads, bounds, dp_rank, dp, microbatches, **kwargs):
            assert (dp_rank, dp) == (0, 1) and microbatches % 2 == 0
            self.samplers = [real(loads, bounds, r, 2, microbatches // 2, **kwargs)
                             for r in (0, 1)]

        def __iter__(self):
            for pair in zip(*self.samplers):
                yield from pair

    balanced.BalancedSampler = BothRanks
    return train(rank, argv, grad_steps)


def assert_dp2_equals_both_ranks_plans(argv, steps):
    """DP=2 on ``argv`` (a --data-balance run) gives the losses and parameters of one
    process trained on both ranks' packed micro-batches; the replicas stay identical."""
    import torch

    ref = run_distributed(train_on_both_ranks_plans, 1, argv, (1, steps))[0]
    ranks = run_distributed(train, 2, argv, (1, steps))
    for it in range(1, steps + 1):
        assert ranks[0]["losses"][it] == pytest.approx(ref["losses"][it], rel=1e-5), it
    for name, value in ref["params"].items():
        torch.testing.assert_close(ranks[0]["params"][name], value, rtol=1e-4, atol=1e-5,
                                   msg=lambda m: f"param {name}: {m}")
        assert torch.equal(ranks[1]["params"][name], ranks[0]["params"][name]), name
    return ref, ranks
