"""Damaged checkpoints, checkpoints of another model and failed saves, on two ranks: each
stops every rank with one error line from rank 0 (no traceback from any rank), and the way
back it names (``--ckpt-step`` of the earlier iteration, or the last complete checkpoint)
trains to the losses of an uninterrupted run.

One launch saves iterations 1 and 2 (the uninterrupted run); one more runs every case
after another, on copies of that checkpoint damaged as a lost node or a quota would."""

import os
import shutil
from types import SimpleNamespace

import pytest
from dist_harness import run_distributed
from script_runs import run_all_as_script
from train_workers import TINY_MODEL, train

pytestmark = pytest.mark.processes

TRACKER = "latest_checkpointed_iteration.txt"
SHARD = "__1_0.distcp"  # rank 1's shard file


def _argv(digits_dir, *extra):
    return TINY_MODEL + ["--data-path", digits_dir, "--micro-batch-size", "2",
                         "--global-batch-size", "4", "--train-iters", "2",
                         "--use-distributed-optimizer", *extra]


def _cut_short(path):
    os.truncate(path, os.path.getsize(path) // 2)


def _overwrite(path):
    with open(path, "wb") as f:
        f.write(b"{not what was saved")


def _garble(path):  # same size, nothing torch can read: only reading it fails
    with open(path, "r+b") as f:
        f.write(bytes(range(256)) * (os.path.getsize(path) // 256))


def _flip_a_byte(path):  # same size: only the checksum sees it
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)[0]
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte ^ 0xFF]))


# name -> (file of iteration 2, what happens to it, the manifest kept, the error says)
DAMAGES = {
    "truncated shard": (SHARD, _cut_short, True, f"{SHARD} has {{half}} bytes, {{size}} "
                                                 f"when saved (cut short)"),
    "deleted shard": (SHARD, os.remove, True, f"{SHARD} is missing"),
    "damaged metadata.json": ("metadata.json", _overwrite, True, "metadata.json has "),
    "damaged .metadata": (".metadata", _overwrite, True, ".metadata has "),
    "shard changed inside": (SHARD, _flip_a_byte, True,
                             f"{SHARD} does not match the CRC-32 it was saved with"),
    # As an older tree's checkpoint or Megatron-LM's: found from the checkpoint's index.
    "truncated shard, no manifest": (SHARD, _cut_short, False, f"{SHARD} has {{half}} "
                                                               f"bytes, .metadata places "
                                                               f"{{size}} there (cut short)"),
    "deleted shard, no manifest": ("__0_0.distcp", os.remove, False, "__0_0.distcp is missing"),
    "damaged metadata.json, no manifest": ("metadata.json", _overwrite, False,
                                           "metadata.json does not parse"),
    "damaged .metadata, no manifest": (".metadata", _overwrite, False,
                                       ".metadata does not unpickle"),
}
# Damage only reading finds (the ranks that read the file fail, every rank stops).
UNREADABLE = {"shard garbled, no manifest": (SHARD, _garble, False,
                                              "could not be read from ")}


@pytest.fixture(scope="module")
def saved(digits_dir, tmp_path_factory):
    """Iterations 1 and 2 saved by an uninterrupted run, and its losses."""
    root = str(tmp_path_factory.mktemp("saved"))
    out = run_distributed(train, 2, _argv(digits_dir, "--save", root, "--save-interval", "1"))
    assert sorted(os.listdir(root)) == ["iter_0000001", "iter_0000002", TRACKER]
    return root, out[0]["losses"]


def _damaged_copy(saved_root, directory, file, damage, manifest):
    shutil.copytree(saved_root, directory)
    path = os.path.join(directory, "iter_0000002")
    if not manifest:
        os.remove(os.path.join(path, "manifest.json"))
    damage(os.path.join(path, file))
    return str(directory)


@pytest.fixture(scope="module")
def runs(saved, digits_dir, tmp_path_factory):
    """Every case in one launch: ``results`` (name -> each rank's ``run_as_script``
    result), ``full_disk`` (the --save of that case), ``shard_size`` (SHARD's, saved)."""
    root, _ = saved
    tmp = tmp_path_factory.mktemp("cases")
    cases = {}
    for name, (file, damage, manifest, _) in {**DAMAGES, **UNREADABLE}.items():
        load = _damaged_copy(root, tmp / name.replace(" ", "_").replace(",", ""), file,
                             damage, manifest)
        cases[name] = {"argv": _argv(digits_dir, "--load", load)}
    # The way back from a damaged iteration 2: iteration 1, one step to iteration 2.
    back = cases["truncated shard"]["argv"] + ["--ckpt-step", "1"]
    cases["--ckpt-step 1"] = {"argv": back}
    # Another model: its flags disagree with the checkpoint's; a model built from the
    # flags alone (as a caller that builds its own) is checked tensor by tensor.
    other = _argv(digits_dir, "--load", root, "--hidden-size", "32")
    cases["other hidden size"] = {"argv": other}
    cases["other hidden size, the flags' model"] = {"argv": other,
                                                     "flags_from_checkpoint": False}
    # A disk that fills up while rank 1 writes iteration 2; then the run resumed.
    failing = str(tmp / "full_disk")
    cases["full disk"] = {"argv": _argv(digits_dir, "--save", failing, "--save-interval", "1"),
                          "full_disk_on_rank": 1, "full_disk_in": "iter_0000002"}
    cases["resumed after the full disk"] = {"argv": _argv(digits_dir, "--load", failing)}
    # A --save directory rank 0 cannot create (a permission, here a file in its path):
    # the other rank learns of it where it would have waited for rank 0.
    (tmp / "a_file").write_text("")
    uncreatable = str(tmp / "a_file" / "ckpt")
    cases["uncreatable --save"] = {"argv": _argv(digits_dir, "--save", uncreatable,
                                                 "--save-interval", "1")}
    ports = tmp / "ports"
    ports.mkdir()
    results = run_distributed(run_all_as_script, 2, list(cases.values()), str(ports))
    return SimpleNamespace(
        results={name: [results[0][i], results[1][i]] for i, name in enumerate(cases)},
        full_disk=failing,
        shard_size=os.path.getsize(os.path.join(root, "iter_0000002", SHARD)))


def _one_error_line(ranks) -> str:
    """The error line rank 0 printed (exit status 2 on every rank, no other error line,
    no traceback)."""
    for rank, result in enumerate(ranks):
        assert result["code"] == 2, (rank, result["stderr"][-3000:])
        printed = result["stdout"] + result["stderr"]
        assert "Traceback" not in printed, (rank, printed[-3000:])
    errors = [line for line in ranks[0]["stderr"].splitlines() if ": error: " in line]
    assert len(errors) == 1, ranks[0]["stderr"][-3000:]
    assert ": error" not in ranks[1]["stderr"], ranks[1]["stderr"][-3000:]
    return errors[0]


@pytest.mark.parametrize("name", DAMAGES)
def test_a_damaged_checkpoint_stops_with_one_line_naming_the_way_back(runs, name):
    line = _one_error_line(runs.results[name])
    size = runs.shard_size
    expected = DAMAGES[name][3].format(size=size, half=size // 2)
    assert "iteration 2 is damaged: " + expected in line, line
    assert "earlier iterations in " in line and ": 1; load one with --ckpt-step 1" in line


def test_a_checkpoint_that_fails_to_read_stops_with_one_line_naming_the_way_back(runs):
    name = "shard garbled, no manifest"
    line = _one_error_line(runs.results[name])
    assert "iteration 2 " + UNREADABLE[name][3] in line, line
    assert "UnpicklingError: " in line and ": 1; load one with --ckpt-step 1" in line


def test_ckpt_step_loads_the_earlier_iteration_and_trains_as_uninterrupted(runs, saved):
    ranks = runs.results["--ckpt-step 1"]
    assert [r["code"] for r in ranks] == [0, 0], ranks[0]["stderr"][-3000:]
    assert ranks[0]["losses"] == {2: saved[1][2]}


def test_a_checkpoint_of_another_model_stops_with_one_line_naming_the_tensors(runs):
    line = _one_error_line(runs.results["other hidden size"])
    assert "--hidden-size 32 disagrees with the checkpoint" in line, line
    line = _one_error_line(runs.results["other hidden size, the flags' model"])
    assert "iteration 2 is a checkpoint of another model: " in line, line
    assert "differ in shape, e.g. " in line and "[64] there, [32] in this model" in line


def test_a_failed_save_stops_every_rank_and_keeps_the_last_checkpoint(runs, saved):
    root = runs.full_disk
    line = _one_error_line(runs.results["full disk"])
    assert (f"saving iteration 2 to {root}/iter_0000002 failed: rank 1: [Errno 28] No space "
            f"left on device" in line), line
    # The partial iteration is gone; the tracker names the last complete one, and a run
    # resumed from it trains to the uninterrupted losses.
    assert sorted(os.listdir(root)) == ["iter_0000001", TRACKER]
    assert open(os.path.join(root, TRACKER)).read() == "1"
    resumed = runs.results["resumed after the full disk"]
    assert [r["code"] for r in resumed] == [0, 0], resumed[0]["stderr"][-3000:]
    assert resumed[0]["losses"] == {2: saved[1][2]}


def test_a_save_directory_rank_0_cannot_create_stops_every_rank(runs):
    line = _one_error_line(runs.results["uncreatable --save"])
    assert "saving iteration 1 to " in line and "failed: NotADirectoryError: " in line, line
