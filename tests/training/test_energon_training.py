"""Training on a Megatron-Energon dataset equals training on the same records as JSONL, in
the same order on the same ranks (one process and DP=2), and a run resumed from a
checkpoint continues mid-epoch with the samples the uninterrupted run read; so does the
separate placement (--encoder-schedule separate) across a resume, its encoder rank reading
both LLM replicas' Energon loaders."""

import json
import os
import shutil

import pytest
from dist_harness import run_distributed
from train_workers import TINY_MODEL, train

pytestmark = pytest.mark.processes

pytest.importorskip("megatron.energon")

STEPS, MBS, GBS, SEED = 4, 2, 4, 1234
TRACKER = "latest_checkpointed_iteration.txt"


@pytest.fixture(scope="module")
def energon_digits(digits_dir, tmp_path_factory):
    from megatron_mm.data.energon_convert import convert

    out = str(tmp_path_factory.mktemp("energon_digits"))
    convert({"train": os.path.join(digits_dir, "train.jsonl"),
             "valid": os.path.join(digits_dir, "valid.jsonl")}, out, shard_size=500,
            log=lambda msg: None)
    return out


def energon_order(path, dp, steps=STEPS, gbs=GBS):
    """Record ids of each rank's micro-batches as training reads them (Energon's order
    depends on the seed, the rank and the world size, not on how samples encode)."""
    from megatron_mm.data import ImageProcessorConfig, build_tokenizer
    from megatron_mm.data.energon import train_batches, worker_config
    from megatron_mm.data.loaders import EncodingSettings

    encoding = EncodingSettings(build_tokenizer(), {"image": 1}, ImageProcessorConfig(16),
                                None, None)
    micro = steps * gbs // (MBS * dp)
    order = []
    for rank in range(dp):
        batches = train_batches(path, encoding.task_encoder(),
                                worker_config(rank, dp, 0, SEED), MBS)
        order.append([next(batches)["record_ids"] for _ in range(micro)])
    return order


def jsonl_in_energon_order(digits_dir, order, out, gbs=GBS):
    """A JSONL file the JSONL path reads in ``order``: the sampler's shuffle of file
    position p is known (MegatronPretrainingSampler, seed), so each record is written
    where that shuffle will take it from."""
    from megatron_mm.data.dataset import MegatronPretrainingSampler

    dp = len(order)
    accum = gbs // (MBS * dp)
    by_position = {}
    for rank, micro_batches in enumerate(order):
        for m, ids in enumerate(micro_batches):
            step, c = divmod(m, accum)
            for j, rid in enumerate(ids):
                by_position[step * gbs + c * MBS * dp + rank * MBS + j] = rid
    n = len(by_position)
    shuffle = MegatronPretrainingSampler(n, 0, MBS, 0, dp, seed=SEED,
                                         global_batch_size=gbs).epoch_order(0)
    lines = {}
    with open(os.path.join(digits_dir, "train.jsonl")) as f:
        for line in f:
            lines[json.loads(line)["id"]] = line
    file_lines = [None] * n
    for position, rid in by_position.items():
        file_lines[shuffle[position]] = lines[rid]
    with open(out, "w") as f:
        f.writelines(file_lines)
    return str(out)


def _argv(*extra):
    return TINY_MODEL + ["--micro-batch-size", str(MBS), "--global-batch-size", str(GBS),
                         "--train-iters", str(STEPS), "--seed", str(SEED), *extra]


@pytest.fixture(scope="module")
def dp2_energon(energon_digits, tmp_path_factory):
    """DP=2 on Energon data with a checkpoint every 2 iterations (shared by the tests)."""
    save = str(tmp_path_factory.mktemp("energon_ckpt"))
    out = run_distributed(train, 2, _argv("--data-path", energon_digits, "--save", save,
                                          "--save-interval", "2"))
    return out[0], save


@pytest.mark.parametrize("dp", [1, 2])
def test_energon_and_jsonl_give_the_same_losses(dp, digits_dir, energon_digits, tmp_path,
                                                request):
    order = energon_order(energon_digits, dp)
    jsonl = jsonl_in_energon_order(digits_dir, order, tmp_path / "ordered.jsonl")
    valid = os.path.join(digits_dir, "valid.jsonl")
    from_jsonl = run_distributed(train, dp, _argv("--data-path", jsonl,
                                                  "--valid-data-path", valid))[0]
    if dp == 2:
        from_energon = request.getfixturevalue("dp2_energon")[0]
    else:
        from_energon = run_distributed(train, 1, _argv("--data-path", energon_digits))[0]
    assert list(from_energon["losses"]) == list(range(1, STEPS + 1))
    for it, loss in from_jsonl["losses"].items():
        assert from_energon["losses"][it] == pytest.approx(loss, rel=1e-6, abs=0), it


def test_energon_resume_continues_mid_epoch(dp2_energon, energon_digits):
    full, save = dp2_energon
    assert {"train_dataloader_dprank000.pt", "train_dataloader_dprank001.pt"} <= set(
        os.listdir(os.path.join(save, "iter_0000002")))
    with open(os.path.join(save, TRACKER), "w") as f:
        f.write("2")
    resumed = run_distributed(train, 2, _argv("--data-path", energon_digits,
                                              "--load", save))[0]
    assert list(resumed["losses"]) == [3, 4]
    for it in (3, 4):
        assert resumed["losses"][it] == full["losses"][it], it


def test_energon_separate_placement_equals_one_process_across_a_resume(
        energon_digits, digits_dir, one_process_reference, tmp_path):
    """One encoder rank serving two LLM replicas on Energon data: it reads each replica's
    loader as that replica does, so the run equals one process on the same records in the
    replicas' order (JSONL). The run stops after iteration 2 and resumes from its
    checkpoint (the encoder rank's loaders from both replicas' saved states): steps 1-2
    before and step 3 after equal the one process's three (losses, gradients, the final
    parameters)."""
    from equivalence import REFERENCE_STEPS, assert_equal_runs

    data = tmp_path / "ordered"
    data.mkdir()
    jsonl_in_energon_order(digits_dir, energon_order(energon_digits, 2, REFERENCE_STEPS, 8),
                           data / "train.jsonl", gbs=8)
    shutil.copy(os.path.join(digits_dir, "valid.jsonl"), data / "valid.jsonl")
    argv, ref = one_process_reference(str(data))
    argv = [energon_digits if a == str(data) else a for a in argv] + [
        "--encoder-schedule", "separate"]
    save = str(tmp_path / "ckpt")
    first = run_distributed(train, 3, argv + ["--train-iters", "2", "--save", save], (1,))
    # the LLM replicas' loader states only (the encoder rank saves none of its own)
    assert sorted(f for f in os.listdir(os.path.join(save, "iter_0000002"))
                  if f.startswith("train_dataloader")) == [
        "train_dataloader_dprank000.pt", "train_dataloader_dprank001.pt"]
    at = argv.index("--load")
    resume = argv[:at] + ["--load", save] + [a for a in argv[at + 2:] if a != "--no-load-optim"]
    resumed = run_distributed(train, 3, resume, (REFERENCE_STEPS,))
    assert list(resumed[1]["losses"]) == [REFERENCE_STEPS]
    # the encoder rank and LLM replica 0, their two runs as one
    stages = [dict(after, losses={**before["losses"], **after["losses"]},
                   grads={**before["grads"], **after["grads"]})
              for before, after in zip(first[:2], resumed[:2])]
    assert_equal_runs(stages, ref, REFERENCE_STEPS, holding="vision_model.")
