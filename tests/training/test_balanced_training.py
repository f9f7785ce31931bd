"""--data-balance in the training loop: DP=2 trains on packed, balanced micro-batches and a
run resumed mid-epoch from a checkpoint gives the same losses as the uninterrupted one; PP=2,
CP=2, PP=2 with the encoder in the bubbles (schedule executor) and the encoder on a rank of
its own serving two LLM replicas (--encoder-schedule separate) on packed micro-batches equal
one process. (The DP=2 check against one process on both ranks' plans, which the
encoder families' training tests use: balanced_runs.py.)"""

import os

import pytest
from balanced_runs import small_digits, train_on_both_ranks_plans
from dist_harness import run_distributed
from train_workers import TINY_MODEL, train


def train_then_resume(rank, argv, save_dir):
    from megatron.core import parallel_state

    import megatron_mm.training.assembly.data_setup as data_setup

    seen, real = [], data_setup.balanced_batch_iterators

    def watched(*args, **kwargs):
        out = []
        for it in real(*args, **kwargs):
            first = next(it)
            seen.append((tuple(first["tokens"].shape), "cu_seqlens" in first))
            out.append(_chain(first, it))
        return out

    data_setup.balanced_batch_iterators = watched
    common = argv + ["--train-iters", "4"]
    full = train(rank, common + ["--save", save_dir, "--save-interval", "2"])
    with open(os.path.join(save_dir, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("2")
    parallel_state.destroy_model_parallel()
    resumed = train(rank, common + ["--load", save_dir])
    return full["losses"], resumed["losses"], seen


def _chain(first, rest):
    yield first
    yield from rest


@pytest.mark.processes
def test_balanced_dp2_resumes_exactly(digits_dir, tmp_path):
    data = small_digits(digits_dir, str(tmp_path / "data"))
    argv = TINY_MODEL + ["--data-path", data, "--micro-batch-size", "2", "--seq-length", "128",
                         "--global-batch-size", "8", "--data-balance", "isf-sorted",
                         "--transformer-impl", "local"]
    results = run_distributed(train_then_resume, 2, argv, str(tmp_path / "ckpt"))
    full, resumed, seen = results[0]
    assert list(resumed) == [3, 4]
    for it in (3, 4):
        assert resumed[it] == full[it], it
    for _, _, rank_seen in results:  # one packed sequence per micro-batch, with its bounds
        assert len(rank_seen) == 2 and all(s[0][0] == 1 and s[1] for s in rank_seen)


def test_flags_are_checked_up_front():
    from megatron_mm.config import ConfigError
    from megatron_mm.training.cli.arguments import build_parser
    from megatron_mm.training.config.validation import validate_args

    def check(*flags):
        args = build_parser().parse_args(["--data-balance", "isf", *flags])
        validate_args(args, world_size=2)

    with pytest.raises(ConfigError, match="--data-balance-bounds '4'"):
        check("--data-balance-bounds", "4")
    with pytest.raises(ConfigError, match="--transformer-impl local"):
        check("--transformer-impl", "transformer_engine")


@pytest.fixture(scope="module")
def balanced_reference(digits_dir, tmp_path_factory):
    """One initial checkpoint and the one-process run from it on packed micro-batches,
    each sample's image attending bidirectionally inside its item (packed samples and
    media items together: the mask every layout must reproduce)."""
    data = small_digits(digits_dir, str(tmp_path_factory.mktemp("balanced") / "data"), n=80)
    init = str(tmp_path_factory.mktemp("init"))
    argv = TINY_MODEL + ["--data-path", data, "--micro-batch-size", "2", "--seq-length", "128",
                         "--global-batch-size", "8", "--data-balance", "isf-sorted",
                         "--transformer-impl", "local", "--media-attention", "bidirectional"]
    run_distributed(train, 1, argv + ["--train-iters", "0", "--save", init])
    argv += ["--train-iters", "2", "--load", init, "--no-load-optim"]
    return argv, run_distributed(train, 1, argv, (1, 2))[0]


@pytest.mark.processes
@pytest.mark.parametrize("layout", [
    # the ViT cut between its layers: packed micro-batches of varying length through p2p
    ["--pipeline-model-parallel-size", "2", "--pipeline-partition", "3,5"],
    # packed documents split over CP ranks by attention work (blocks of 8 tokens)
    ["--context-parallel-size", "2", "--context-parallel-block", "8"],
    ["--context-parallel-size", "4", "--context-parallel-block", "8"],
    # the ViT as its own pipeline, its pieces in the LLM's bubbles (schedule executor)
    ["--pipeline-model-parallel-size", "2", "--encoder-schedule", "bubble"],
    # packed lengths padded to a multiple of TP by a segment of their own
    ["--tensor-model-parallel-size", "2", "--sequence-parallel"],
], ids=["pp2", "cp2", "cp4", "pp2-bubble", "tp2-sp"])
def test_balanced_parallel_equals_one_process(balanced_reference, layout):
    """Packed, balanced micro-batches (with bidirectional media items) under PP=2, CP=2,
    CP=4, the bubble schedule or TP=2 + SP: the same losses and gradients as one process
    (packed samples stay apart on every stage and CP rank)."""
    import torch

    argv, ref = balanced_reference
    world = 4 if "4" in layout else 2
    ranks = run_distributed(train, world, argv + layout, (1, 2))
    last = ranks[-1]
    for it in (1, 2):
        assert last["losses"][it] == pytest.approx(ref["losses"][it], rel=1e-5), it
    pp = "--pipeline-model-parallel-size" in layout
    for step in (1, 2):
        ours = {**ranks[0]["grads"][step], **(ranks[1]["grads"][step] if pp else {})}
        assert ours.keys() == ref["grads"][step].keys()
        for name, value in ref["grads"][step].items():
            if value is None:
                continue
            if step == 1:
                torch.testing.assert_close(ours[name], value, rtol=1e-4, atol=1e-6,
                                           msg=lambda m: f"step 1 {name}: {m}")
            else:  # Adam's first step turns fp32 noise on near-zero gradients into +-lr
                # updates of single weights: compare each tensor as a whole
                error = (ours[name] - value).norm() / value.norm().clamp(min=1e-12)
                assert error < 1e-3, (name, error.item())


@pytest.mark.processes
def test_balanced_separate_placement_equals_one_process(balanced_reference):
    """--encoder-schedule separate on packed, balanced micro-batches, one encoder rank
    serving two LLM replicas: it encodes each replica's packed micro-batches of the plan
    (at the LLM's data-parallel size), so the run equals one process trained on both
    replicas' micro-batches (``train_on_both_ranks_plans``)."""
    import torch
    from equivalence import assert_equal_runs

    # the bounds DP=2 searches (one process searches for DP=1)
    argv = balanced_reference[0] + ["--data-balance-bounds", "3,80"]
    ref = run_distributed(train_on_both_ranks_plans, 1, argv, (1, 2))[0]
    ranks = run_distributed(train, 3, argv + ["--encoder-schedule", "separate"], (1, 2))
    assert any(n.startswith("vision_model.") for n in ranks[0]["params"])
    assert_equal_runs(ranks[:2], ref, 2, holding="vision_model.")
    for name, value in ranks[1]["params"].items():  # the LLM replicas stay identical
        assert torch.equal(ranks[2]["params"][name], value), name
