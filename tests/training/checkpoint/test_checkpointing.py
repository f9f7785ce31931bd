"""Distributed checkpoints: exact resume, resharding TP=2 -> TP=1 and PP=2 -> PP=1 / PP=4
(any partition), a crash mid-save that leaves the last good checkpoint loadable, and a
checkpoint saved by an older tree that still loads with the validation loss it had."""

import os

import pytest
from dist_harness import run_distributed
from train_workers import TINY_MODEL, train

pytestmark = pytest.mark.processes

TRACKER = "latest_checkpointed_iteration.txt"
# Saved at commit 31cef44 (before the package's restructuring), with its tokenizer
# (tokenizer/, 300 tokens) and the validation loss that run printed; docs/testing.md says
# how it was made.
OLD_CHECKPOINT = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "fixtures",
                              "checkpoint_31cef44")
OLD_CHECKPOINT_VAL_LOSS = 5.917494297027588


def _argv(digits_dir, *extra):
    return TINY_MODEL + ["--data-path", digits_dir, "--micro-batch-size", "2",
                         "--global-batch-size", "4", *extra]


def _point_tracker(root, iteration):
    with open(os.path.join(root, TRACKER), "w") as f:
        f.write(str(iteration))


def test_resume_gives_the_same_losses(digits_dir, tmp_path):
    # DP=2 with the distributed optimizer, dropout on (RNG state must be restored too),
    # warm-up then cosine decay (scheduler state), 6 steps with a save every 3.
    common = _argv(digits_dir, "--use-distributed-optimizer", "--hidden-dropout", "0.1",
                   "--attention-dropout", "0.1", "--lr-decay-style", "cosine",
                   "--lr-warmup-iters", "2", "--train-iters", "6")
    full = run_distributed(train, 2, common + ["--save", str(tmp_path), "--save-interval", "3"])
    assert sorted(os.listdir(tmp_path)) == ["iter_0000003", "iter_0000006", TRACKER]
    _point_tracker(tmp_path, 3)
    resumed = run_distributed(train, 2, common + ["--load", str(tmp_path)])
    assert list(resumed[0]["losses"]) == [4, 5, 6]
    for it in (4, 5, 6):
        assert resumed[0]["losses"][it] == full[0]["losses"][it], it
    assert resumed[0]["params"].keys() == full[0]["params"].keys()
    for name, value in full[0]["params"].items():
        assert resumed[0]["params"][name].equal(value), name


def test_checkpoint_saved_at_tp2_loads_at_tp1(digits_dir, tmp_path):
    common = _argv(digits_dir, "--train-iters", "3")
    tp2 = run_distributed(train, 2, common + ["--tensor-model-parallel-size", "2",
                                              "--save", str(tmp_path), "--save-interval", "2"])
    _point_tracker(tmp_path, 2)
    # The TP=1 run inherits the checkpoint's vocabulary padding (32256, not 32128).
    tp1 = run_distributed(train, 1, common + ["--load", str(tmp_path)])[0]
    assert list(tp1["losses"]) == [3]
    assert tp1["losses"][3] == pytest.approx(tp2[0]["losses"][3], rel=1e-5)


def test_checkpoint_saved_at_pp2_loads_at_pp1_and_pp4(digits_dir, tmp_path):
    # Saved with the ViT split over two stages; loaded whole, and over four stages with a
    # different cut: layers keep their global numbers in the checkpoint, so any partition
    # reads it (weights and optimizer state: the third step matches).
    common = _argv(digits_dir, "--train-iters", "3")
    pp2 = run_distributed(train, 2, common + ["--pipeline-model-parallel-size", "2",
                                              "--pipeline-partition", "3,5",
                                              "--save", str(tmp_path), "--save-interval", "2"])
    _point_tracker(tmp_path, 2)
    pp1 = run_distributed(train, 1, common + ["--load", str(tmp_path)])[0]
    pp4 = run_distributed(train, 4, common + ["--pipeline-model-parallel-size", "4",
                                              "--pipeline-partition", "2,2,2,2",
                                              "--load", str(tmp_path)])
    expected = pp2[-1]["losses"][3]
    assert list(pp1["losses"]) == [3] and list(pp4[-1]["losses"]) == [3]
    assert pp1["losses"][3] == pytest.approx(expected, rel=1e-5)
    assert pp4[-1]["losses"][3] == pytest.approx(expected, rel=1e-5)


def crash_on_second_save(rank, argv):
    from megatron.core import dist_checkpointing

    real_save, calls = dist_checkpointing.save, []

    def flaky_save(state, directory, **kwargs):
        calls.append(directory)
        if len(calls) == 2:  # die half-way: some shard files written, no metadata
            open(os.path.join(directory, "__0_0.distcp"), "wb").write(b"partial")
            raise RuntimeError("simulated crash during save")
        return real_save(state, directory, **kwargs)

    dist_checkpointing.save = flaky_save
    try:
        train(rank, argv)
    except RuntimeError as e:
        return str(e)
    return "no crash"


def test_crash_mid_save_keeps_the_last_checkpoint(digits_dir, tmp_path):
    argv = _argv(digits_dir, "--train-iters", "3", "--save", str(tmp_path),
                 "--save-interval", "1")
    assert run_distributed(crash_on_second_save, 1, argv)[0] == "simulated crash during save"
    assert open(tmp_path / TRACKER).read().strip() == "1"
    assert "iter_0000002" not in os.listdir(tmp_path)  # only its .inprogress staging dir
    # Resuming from the same directory loads iteration 1 and finishes the run.
    out = run_distributed(train, 1, argv + ["--load", str(tmp_path)])[0]
    assert list(out["losses"]) == [2, 3]
    assert open(tmp_path / TRACKER).read().strip() == "3"
    assert not any(name.endswith(".inprogress") for name in os.listdir(tmp_path))


def train_printing(rank, argv):
    """``train`` that also returns what the run printed."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        summary = train(rank, argv)
    return {**summary, "stdout": out.getvalue()}


def test_checkpoint_without_optimizer_state_loads_its_weights(digits_dir, tmp_path):
    # Saved before the first step: Adam has no moments yet, so the checkpoint holds none.
    # Loading it takes the weights (another seed would initialise others) and says so.
    saved = run_distributed(train, 1, _argv(digits_dir, "--train-iters", "0",
                                            "--save", str(tmp_path)))[0]
    loaded = run_distributed(train_printing, 1, _argv(digits_dir, "--train-iters", "0",
                                                      "--seed", "7", "--load", str(tmp_path)))[0]
    assert "holds no optimizer state" in loaded["stdout"]
    for name, value in saved["params"].items():
        assert loaded["params"][name].equal(value), name


def test_checkpoint_saved_by_an_older_tree_loads_with_its_validation_loss(digits_dir):
    # The architecture and tokenizer come from the checkpoint; --train-iters at its
    # iteration: no step, the final evaluation only.
    summary = run_distributed(train, 1, [
        "--load", OLD_CHECKPOINT, "--data-path", digits_dir, "--micro-batch-size", "4",
        "--global-batch-size", "4", "--train-iters", "2", "--lr", "1e-3",
        "--eval-iters", "1"])[0]
    assert summary["iteration"] == 2 and summary["losses"] == {}
    assert summary["val_loss"] == pytest.approx(OLD_CHECKPOINT_VAL_LOSS, rel=1e-6)
