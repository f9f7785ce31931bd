"""The checks a load runs before reading a checkpoint (``checkpoint_integrity.py``), and
``--ckpt-step``, on files alone: a manifest names the file cut short, missing or changed;
a checkpoint without one (the one an older tree saved) is checked against its own index.
The same, with ranks and the training script, is ``test_checkpoint_faults.py``."""

import os
import shutil

import pytest

from megatron_mm.config import ConfigError
from megatron_mm.training.cli.arguments import build_parser, read_args
from megatron_mm.training.checkpoint.integrity import (
    checkpoint_files, damaged_files, file_entries, write_manifest)
from megatron_mm.training.checkpoint.checkpointing import (
    CheckpointError, locate_checkpoint, way_back)
from megatron_mm.training.config.run_config import group_of_flags

OLD_CHECKPOINT = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "fixtures",
                              "checkpoint_31cef44", "iter_0000002")


@pytest.fixture
def old_checkpoint(tmp_path):
    """A copy of a real checkpoint saved without a manifest (by commit 31cef44)."""
    return shutil.copytree(OLD_CHECKPOINT, tmp_path / "iter_0000002")


def _with_manifest(directory):
    names = checkpoint_files(directory)
    write_manifest(directory, 2, {**file_entries(directory, names[::2]),
                                  **file_entries(directory, names[1::2])})
    return names


def test_the_manifest_names_a_file_cut_short_missing_or_changed(old_checkpoint):
    names = _with_manifest(old_checkpoint)
    assert names == [".metadata", "__0_0.distcp", "metadata.json", "model_config.json"]
    assert damaged_files(old_checkpoint) == []
    shard = os.path.join(old_checkpoint, "__0_0.distcp")
    with open(shard, "r+b") as f:  # one byte changed: same size
        f.seek(100)
        byte = f.read(1)[0]
        f.seek(100)
        f.write(bytes([byte ^ 1]))
    assert damaged_files(old_checkpoint, checksums=False) == []
    assert damaged_files(old_checkpoint) == [
        "__0_0.distcp does not match the CRC-32 it was saved with"]
    os.truncate(shard, 1000)
    os.remove(os.path.join(old_checkpoint, "metadata.json"))
    assert damaged_files(old_checkpoint, checksums=False) == [
        "__0_0.distcp has 1000 bytes, 147994 when saved (cut short)", "metadata.json is missing"]
    # Two ranks share the files: each names its own.
    assert damaged_files(old_checkpoint, (0, 2)) == ["metadata.json is missing"]
    assert damaged_files(old_checkpoint, (1, 2)) == [
        "__0_0.distcp has 1000 bytes, 147994 when saved (cut short)"]
    # Before any process group, each process checks only what it reads first.
    assert damaged_files(old_checkpoint, index_only=True) == ["metadata.json is missing"]
    with open(os.path.join(old_checkpoint, "manifest.json"), "w") as f:
        f.write("{")
    assert damaged_files(old_checkpoint)[0].startswith("manifest.json is damaged")


@pytest.mark.parametrize("damage, problem", [
    (lambda d: os.truncate(os.path.join(d, "__0_0.distcp"), 5000),
     "__0_0.distcp has 5000 bytes, .metadata places "),
    (lambda d: os.remove(os.path.join(d, "__0_0.distcp")), "__0_0.distcp is missing"),
    (lambda d: open(os.path.join(d, ".metadata"), "wb").write(b"{"),
     ".metadata does not unpickle"),
    (lambda d: os.remove(os.path.join(d, ".metadata")), ".metadata is missing"),
    (lambda d: open(os.path.join(d, "metadata.json"), "w").write("{"),
     "metadata.json does not parse"),
])
def test_without_a_manifest_the_index_names_the_damaged_file(old_checkpoint, damage, problem):
    assert damaged_files(old_checkpoint) == []
    damage(old_checkpoint)
    assert damaged_files(old_checkpoint)[0].startswith(problem)
    assert damaged_files(old_checkpoint, (1, 2)) == []  # the structure is rank 0's to check
    # The index alone (before any process group): the shards are not looked at.
    index = damaged_files(old_checkpoint, index_only=True)
    assert index == ([] if problem.startswith("__0_0") else damaged_files(old_checkpoint))


def _checkpoint_group(*argv):
    return group_of_flags("checkpoint", build_parser().parse_args(list(argv)))


def test_ckpt_step_loads_its_iteration_instead_of_the_trackers(tmp_path):
    for iteration in (1, 2, 3):
        (tmp_path / f"iter_000000{iteration}").mkdir()
    (tmp_path / "iter_0000004.inprogress").mkdir()  # a save that never completed
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("3")
    load = str(tmp_path)
    assert locate_checkpoint(_checkpoint_group("--load", load)) == 3
    assert locate_checkpoint(_checkpoint_group("--load", load, "--ckpt-step", "2")) == 2
    # Megatron-LM's: 0 is no step (the tracker's iteration).
    assert locate_checkpoint(_checkpoint_group("--load", load, "--ckpt-step", "0")) == 3
    with pytest.raises(CheckpointError, match=(
            r"--ckpt-step 4 names iteration 4 but .*iter_0000004 is missing; earlier "
            r"iterations in .*: 1, 2, 3; load one with --ckpt-step 3")):
        locate_checkpoint(_checkpoint_group("--load", load, "--ckpt-step", "4"))
    # A tracker that names no iteration: the iterations there are named.
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("3\x00\x00")
    with pytest.raises(CheckpointError, match=(
            r"holds '3\\x00\\x00', not an iteration number; iterations in .*: 1, 2, 3; "
            r"load one with --ckpt-step 3")):
        locate_checkpoint(_checkpoint_group("--load", load))
    assert locate_checkpoint(_checkpoint_group("--load", load, "--ckpt-step", "2")) == 2


def test_the_way_back_names_the_latest_earlier_iteration_else_any_other(tmp_path):
    for iteration in (1, 3):
        (tmp_path / f"iter_000000{iteration}").mkdir()
    root = str(tmp_path)
    assert way_back(root, 3) == f"earlier iterations in {root}: 1; load one with --ckpt-step 1"
    assert way_back(root, 1) == f"iterations in {root}: 3; load one with --ckpt-step 3"
    (tmp_path / "iter_0000003").rmdir()
    assert way_back(root, 1).startswith(f"no other iteration is in {root}: restore")


@pytest.mark.parametrize("argv, message", [
    (["--ckpt-step", "2"], "--ckpt-step needs --load DIR"),
    (["--ckpt-step", "-1", "--load", "x"], "--ckpt-step must not be negative"),
])
def test_bad_ckpt_step_flags(argv, message):
    with pytest.raises(ConfigError, match=message):
        read_args(argv, world_size=1)
