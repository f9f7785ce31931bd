"""M-RoPE (--position-embedding-type mrope) with 3-D positions that differ across the three
axes: CP=2 x PP=2 equals one process from the same initial checkpoint (losses and
gradients), on padded micro-batches ([3, B, L] positions, padding counting on) and on
packed ones (--data-balance: each sample's positions concatenated); so does TP=2 with
--sequence-parallel on packed ones. The padded run also checks the final evaluation
(validation loss, greedy answers). Every pipeline stage
takes the positions from its own copy of the micro-batch; each CP rank rotates its tokens
at their own positions."""

import pytest
import torch
from balanced_runs import small_digits
from dist_harness import run_distributed
from mrope_workers import MROPE, train_with_positions
from train_workers import TINY_MODEL

pytestmark = pytest.mark.processes

STEPS = 2
CP2_PP2 = ["--context-parallel-size", "2", "--context-parallel-block", "8",
           "--pipeline-model-parallel-size", "2"]

DATA = {
    "padded": ["--micro-batch-size", "4"],
    "packed": ["--micro-batch-size", "2", "--seq-length", "128", "--data-balance",
               "isf-sorted", "--transformer-impl", "local"],
}


@pytest.fixture(scope="module")
def references(digits_dir, tmp_path_factory):
    """Per data mode, one initial checkpoint and the one-process run from it (built on
    first use, shared by that mode's layouts)."""
    data = small_digits(digits_dir, str(tmp_path_factory.mktemp("mrope") / "data"), n=80)
    cache = {}

    def get(mode):
        if mode not in cache:
            init = str(tmp_path_factory.mktemp("init"))
            # padded: with the final evaluation (validation loss, and greedy answers whose
            # generated tokens continue the prompt's 3-D positions)
            model = [a for a in TINY_MODEL if mode == "packed" or a != "--skip-final-eval"]
            argv = model + MROPE + ["--data-path", data, "--global-batch-size", "8"]
            argv += DATA[mode]
            run_distributed(train_with_positions, 1,
                            argv + ["--train-iters", "0", "--save", init])
            argv += ["--train-iters", str(STEPS), "--load", init, "--no-load-optim"]
            cache[mode] = argv, run_distributed(train_with_positions, 1, argv, (1, STEPS))[0]
        return cache[mode]
    return get


@pytest.mark.parametrize("mode, world, layout", [
    ("padded", 4, CP2_PP2),
    ("packed", 4, CP2_PP2),
    # each TP rank's sequence shard rotated by the whole sequence's positions
    ("packed", 2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
], ids=["padded-cp2-pp2", "packed-cp2-pp2", "packed-tp2-sp"])
def test_mrope_parallel_equals_one_process(references, mode, world, layout):
    argv, ref = references(mode)
    ranks = run_distributed(train_with_positions, world, argv + layout, (1, STEPS))
    for out in [ref] + ranks:  # 3-D positions, unequal across axes, on every chunk
        assert out["observed"]["positions"] and all(
            dim == 3 and unequal for dim, unequal in out["observed"]["positions"])
    pp = 2 if "--pipeline-model-parallel-size" in layout else 1
    stages = ranks[::world // pp]  # TP / CP rank 0 of each stage
    for it in range(1, STEPS + 1):
        assert stages[-1]["losses"][it] == pytest.approx(ref["losses"][it], rel=1e-5), it
    if mode == "padded":
        assert stages[-1]["val_loss"] == pytest.approx(ref["val_loss"], rel=1e-5)
        assert stages[-1]["val_accuracy"] == ref["val_accuracy"]
    for it in (1, STEPS):
        ours = {}
        for stage in stages:
            ours.update(stage["grads"][it])
        assert ours.keys() == ref["grads"][it].keys()
        for name, value in ref["grads"][it].items():
            if value is None:
                continue
            if it == 1:
                torch.testing.assert_close(ours[name], value, rtol=1e-4, atol=1e-6,
                                           msg=lambda m: f"grad {it} {name}: {m}")
            else:  # Adam's first step turns fp32 noise on near-zero gradients into +-lr
                error = (ours[name] - value).norm() / value.norm().clamp(min=1e-12)
                assert error < 1e-3, (name, error.item())
