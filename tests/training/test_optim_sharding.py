"""The distributed optimizer's checkpoint format, as Megatron-LM saves it: dp_reshardable
by default (each rank writes its own shard; ``training/checkpointing.py: optim_metadata``),
fully_reshardable with ``--dist-ckpt-optim-fully-reshardable``. A dp_reshardable state
loads at another data-parallel size with the losses of the run that saved it; at another
TP size it is one error naming the ways out."""

import os

import pytest
from dist_harness import run_distributed
from train_workers import TINY_MODEL, train

pytestmark = pytest.mark.processes


def _train_or_error(rank, argv):
    from megatron_mm.training.checkpoint.errors import CheckpointError

    try:
        return train(rank, argv)["losses"]
    except CheckpointError as e:
        return str(e)


def _saved_keys(root):
    from megatron.core import dist_checkpointing

    return list(dist_checkpointing.load_tensors_metadata(os.path.join(root, "iter_0000002")))


def test_dp_reshardable_loads_at_another_dp_size_and_stops_at_another_tp(digits_dir,
                                                                          tmp_path):
    common = TINY_MODEL + ["--data-path", digits_dir, "--micro-batch-size", "2",
                           "--global-batch-size", "4", "--train-iters", "3",
                           "--use-distributed-optimizer"]
    full = run_distributed(train, 2, common + ["--save", str(tmp_path), "--save-interval", "2"])
    with open(tmp_path / "latest_checkpointed_iteration.txt", "w") as f:
        f.write("2")
    keys = _saved_keys(str(tmp_path))  # Megatron-Core's bucket-space keys, no param names
    assert any(k.startswith("optimizer.distributed.dp_group_idx_0.gbuf_idx_0.") for k in keys)
    assert not any(k.startswith("optimizer.state.exp_avg.") for k in keys)
    # DP 1: the shards of both ranks, resharded; the third step is the DP=2 run's
    dp1 = run_distributed(_train_or_error, 1, common + ["--load", str(tmp_path)])[0]
    assert list(dp1) == [3] and dp1[3] == pytest.approx(full[0]["losses"][3], rel=1e-5)
    # TP 2: Megatron-LM refuses it too; the message names both ways out, on every rank
    tp2 = run_distributed(_train_or_error, 2, common + ["--load", str(tmp_path),
                                                        "--tensor-model-parallel-size", "2"])
    assert tp2[0] == tp2[1]
    assert "dp_reshardable, saved at (TP, PP) = (1, 1)" in tp2[0]
    assert "--no-load-optim" in tp2[0] and "--dist-ckpt-optim-fully-reshardable" in tp2[0]


def test_dp_reshardable_stops_at_another_partition_and_search_keeps_the_saved_one(
        digits_dir, tmp_path):
    """The state is in DDP bucket space, whose buckets follow the layers on each stage:
    another --pipeline-partition at resume is one error naming it (before: a shape error,
    or Adam moments on other parameters); a resumed --pipeline-partition search keeps the
    checkpoint's partition (its timing-based pick could differ) and resumes exactly."""
    common = TINY_MODEL + ["--data-path", digits_dir, "--micro-batch-size", "2",
                           "--global-batch-size", "4", "--train-iters", "3",
                           "--use-distributed-optimizer", "--pipeline-model-parallel-size",
                           "2"]
    full = run_distributed(train, 2, common + ["--pipeline-partition", "6,2", "--save",
                                               str(tmp_path), "--save-interval", "2"])
    with open(tmp_path / "latest_checkpointed_iteration.txt", "w") as f:
        f.write("2")
    moved = run_distributed(_train_or_error, 2, common + ["--load", str(tmp_path),
                                                          "--pipeline-partition", "5,3"])
    assert moved[0] == moved[1] and isinstance(moved[0], str), moved
    assert "the pipeline partition (layers per chunk) [6, 2] -> [5, 3]" in moved[0]
    assert "--no-load-optim" in moved[0] and "--dist-ckpt-optim-fully-reshardable" in moved[0]
    searched = run_distributed(_train_or_error, 2, common + ["--load", str(tmp_path),
                                                             "--pipeline-partition", "search"])
    assert list(searched[1]) == [3], searched
    assert searched[1][3] == pytest.approx(full[1]["losses"][3], rel=1e-5)
