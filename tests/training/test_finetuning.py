"""Fine-tuning: LoRA adapters on the LLM and the ViT (their base weights frozen) next to
a projector trained whole, at rates of their own (``--vision-lr``, ``--projector-lr``). Each
group's parameters move by its own rate in the first Adam step (a hand computation); each
group's rate follows the schedule between its own peak and minimum (in TensorBoard too);
TP=2 + SP, PP=2 with interleaving and the bubble schedule, CP=2 and DP=2 with the
distributed optimizer equal one process (losses, adapter gradients, parameters), the LLM's
and the ViT's base weights unchanged bit for bit; the TP=2 checkpoint loads at TP=1 (the
adapters resharded) and a resumed run continues bit for bit."""

import math
import os

import pytest
import torch
from dist_harness import run_distributed
from equivalence import assert_equal_runs
from finetune_workers import train_finetune
from train_workers import TINY_MODEL

pytestmark = pytest.mark.processes

STEPS = 3
LR, MIN_LR, WD = 1e-3, 1e-4, 0.05
VISION = dict(lr=3e-3, min_lr=3e-4, wd=0.1)
PROJECTOR = dict(lr=1e-2, min_lr=MIN_LR, wd=WD)  # its min: --min-lr's
RATES = ["--lr", str(LR), "--min-lr", str(MIN_LR), "--weight-decay", str(WD),
         "--lr-decay-style", "cosine", "--clip-grad", "1e6",
         "--vision-lr", str(VISION["lr"]), "--vision-min-lr", str(VISION["min_lr"]),
         "--vision-weight-decay", str(VISION["wd"]), "--projector-lr", str(PROJECTOR["lr"])]
# adapters on every linear of the LLM's attention and MLP and of the ViT (both bases
# frozen; the ViT's adapters at --vision-lr), the projector trained whole
LORA = ["--lora-rank", "4", "--lora-alpha", "8", "--num-layers", "4",
        "--lora-target-modules", "all-linear", "vision_model.all-linear"]


# Adam turns fp32 noise in a near-zero gradient into an update of up to its rate: 1% of
# the largest one (the projector's), as equivalence.py allows 1% of --lr
PARAMS_ATOL = 1e-2 * PROJECTOR["lr"]


def _argv(data, *extra):
    return TINY_MODEL + RATES + LORA + ["--data-path", data, "--train-iters", str(STEPS), *extra]


def _module(name):
    top = name.split(".")[0]
    return {"vision_model": VISION, "vision_projection": PROJECTOR}.get(
        top, dict(lr=LR, min_lr=MIN_LR, wd=WD))


def _assert_base_unchanged(stages):
    # the LLM's own weights, frozen, are bit for bit the initial ones; its adapters moved
    before = {k: v for out in stages for k, v in out["params_at"][0].items()}
    after = {k: v for out in stages for k, v in out["params"].items()}
    for top in ("language_model.", "vision_model."):
        adapters = [n for n in after if n.startswith(top) and ".lora_" in n]
        assert adapters and len(adapters) < len([n for n in after if n.startswith(top)])
    for name in (n for n in after if n.startswith(("language_model.", "vision_model."))):
        assert after[name].equal(before[name]) == (".lora_" not in name), name


def _cosine(settings, iteration):
    ratio = iteration / STEPS  # the scheduler counts samples: iterations x batch
    return settings["min_lr"] + (settings["lr"] - settings["min_lr"]) * 0.5 * (
        1 + math.cos(math.pi * ratio))


@pytest.fixture(scope="module")
def runs(digits_dir, tmp_path_factory):
    # every run starts from one initial checkpoint (pipeline stages draw other streams)
    init, tb = (str(tmp_path_factory.mktemp(d)) for d in ("init", "tb"))
    # (its vocabulary padded for TP 2: the same padded rows for every run)
    run_distributed(train_finetune, 1, _argv(digits_dir, "--train-iters", "0", "--save", init,
                                             "--make-vocab-size-divisible-by", "256"))
    ref = run_distributed(train_finetune, 1, _argv(digits_dir, "--micro-batch-size", "4",
                                                   "--global-batch-size", "8", "--load", init,
                                                   "--tensorboard-dir", tb))[0]
    return {"ref": ref, "tensorboard": tb, "init": init}


def test_each_group_moves_by_its_own_rate(runs):
    # AdamW's first step from p0 with gradient g: p1 = p0 (1 - lr wd) - lr g / (|g| + eps)
    # (bias corrections cancel); no weight decay on biases and 1-D parameters.
    ref = runs["ref"]
    p0, p1, g = ref["params_at"][0], ref["params_at"][1], ref["grads"][1]
    seen = set()
    for name, before in p0.items():
        if g[name] is None:
            continue
        settings = _module(name)
        seen.add(settings["lr"])
        wd = 0.0 if before.dim() == 1 or name.endswith(".bias") else settings["wd"]
        lr = settings["lr"]
        want = before * (1 - lr * wd) - lr * g[name] / (g[name].abs() + 1e-8)
        torch.testing.assert_close(p1[name], want, rtol=0, atol=2e-7,
                                   msg=lambda m: f"{name}: {m}")
    assert seen == {LR, VISION["lr"], PROJECTOR["lr"]}
    _assert_base_unchanged([ref])


def test_each_group_follows_the_schedule_and_is_logged(runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ref = runs["ref"]
    events = EventAccumulator(runs["tensorboard"], size_guidance={"scalars": 0})
    events.Reload()
    scalars = {tag: {e.step: e.value for e in events.Scalars(tag)}
               for tag in events.Tags()["scalars"]}
    for it in range(1, STEPS + 1):
        assert ref["rates"][it] == pytest.approx(
            {"vision": _cosine(VISION, it), "projector": _cosine(PROJECTOR, it)}, rel=1e-12)
        for tag, settings in (("learning-rate", dict(lr=LR, min_lr=MIN_LR)),
                              ("vision-learning-rate", VISION),
                              ("projector-learning-rate", PROJECTOR)):
            assert scalars[tag][it] == pytest.approx(_cosine(settings, it), rel=1e-6), tag


@pytest.mark.parametrize("world, layout", [
    (2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
    (2, ["--pipeline-model-parallel-size", "2", "--virtual-pipeline-model-parallel-size", "2",
         "--encoder-schedule", "bubble", "--encoder-pipeline-model-parallel-size", "1",
         "--encoder-pieces", "2"]),
    (2, ["--context-parallel-size", "2", "--context-parallel-block", "8"]),
], ids=["tp2-sp", "pp2-vpp2-bubble", "cp2"])
def test_parallel_runs_equal_one_process(digits_dir, runs, world, layout, tmp_path):
    tp2 = "--tensor-model-parallel-size" in layout
    ranks = run_distributed(train_finetune, world, _argv(
        digits_dir, "--micro-batch-size", "4", "--global-batch-size", "8",
        "--load", runs["init"], *layout, *(["--save", str(tmp_path)] if tp2 else [])))
    stages = ranks if "--pipeline-model-parallel-size" in layout else ranks[:1]
    assert_equal_runs(stages, runs["ref"], STEPS, params_atol=PARAMS_ATOL)
    assert stages[0]["rates"] == runs["ref"]["rates"]
    _assert_base_unchanged(stages)
    if tp2:  # its checkpoint, adapters split over TP=2, loads at TP=1 (resharded)
        loaded = run_distributed(train_finetune, 1, _argv(digits_dir, "--load",
                                                          str(tmp_path)))[0]
        assert loaded["params_at"][0].keys() == stages[0]["params"].keys()
        for name, value in stages[0]["params"].items():
            assert loaded["params_at"][0][name].equal(value), name


def test_dp2_distributed_optimizer_equals_one_process_and_resumes_exactly(
        digits_dir, runs, tmp_path):
    common = _argv(digits_dir, "--micro-batch-size", "2", "--global-batch-size", "8",
                   "--use-distributed-optimizer")
    full = run_distributed(train_finetune, 2, common + [
        "--load", runs["init"], "--save", str(tmp_path), "--save-interval", "2"])
    # (the distributed optimizer's gradient buffer holds this rank's shard only after the
    # reduce-scatter: losses and parameters are compared, as test_parallel_equivalence)
    ref = runs["ref"]
    for it in range(1, STEPS + 1):
        assert full[0]["losses"][it] == pytest.approx(ref["losses"][it], rel=1e-5), it
    for name, value in ref["params"].items():
        torch.testing.assert_close(full[0]["params"][name], value, rtol=1e-4,
                                   atol=PARAMS_ATOL, msg=lambda m: f"{name}: {m}")
    assert full[0]["rates"] == ref["rates"]
    _assert_base_unchanged(full[:1])
    with open(os.path.join(tmp_path, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("2")
    resumed = run_distributed(train_finetune, 2, common + ["--load", str(tmp_path)])
    assert list(resumed[0]["losses"]) == [3]
    assert resumed[0]["losses"][3] == full[0]["losses"][3]
    assert resumed[0]["rates"][3] == full[0]["rates"][3]
    for name, value in full[0]["params"].items():
        assert resumed[0]["params"][name].equal(value), name
