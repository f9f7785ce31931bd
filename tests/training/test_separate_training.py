"""``--encoder-schedule separate`` through the training script: the encoders on ranks of
their own next to the LLM's pipeline (``training/separate_run.py``), loading the colocated
initial checkpoint, equal one process (losses, gradients of the first and last step,
parameters) with a trainable and a frozen ViT, with two encoder ranks and with one encoder
rank serving two LLM replicas, and as ``--encoder-schedule auto``'s pick; its checkpoint
loads colocated (the colocated keys)."""

import math

import pytest
import torch
from dist_harness import run_distributed
from equivalence import REFERENCE_STEPS as STEPS
from equivalence import assert_equal_runs, merge_stages
from train_workers import train

pytestmark = pytest.mark.processes

SEPARATE = ["--pipeline-model-parallel-size", "2", "--encoder-schedule", "separate"]


@pytest.mark.parametrize("encoder_ranks, llm_dp, model, auto", [
    (1, 1, [], False), (1, 1, ["--freeze-ViT"], False), (2, 1, [], False),
    # one encoder rank serving two LLM replicas (encoder DP unlike LLM DP)
    (1, 2, [], False),
    # --encoder-schedule auto on 2 ranks at PP 2 picks 1 encoder rank + the LLM at PP 1
    # (a frozen ViT as heavy as the LLM, by its layer profile)
    (1, 1, ["--freeze-ViT"], True)],
    ids=["1-encoder-rank", "1-encoder-rank-frozen-vit", "2-encoder-ranks",
         "1-encoder-rank-llm-dp2", "auto-separate"])
def test_separate_placement_equals_one_process(one_process_reference, digits_dir,
                                               tmp_path_factory, encoder_ranks, llm_dp,
                                               model, auto):
    argv, ref = one_process_reference(digits_dir, model)
    saved = tmp_path_factory.mktemp("separate")
    if auto:
        from plans import separate_profile

        layout = SEPARATE[:2] + ["--encoder-schedule", "auto"]
        layout += ["--pipeline-profile", separate_profile(argv + layout, 2,
                                                          saved / "profile.json", 20, 10)]
        llm_pp = 1
    else:
        layout = SEPARATE + ["--encoder-data-parallel-size", str(encoder_ranks)]
        llm_pp = 2
    ranks = run_distributed(train, encoder_ranks + llm_pp * llm_dp,
                            argv + layout + ["--save", str(saved)], (1, STEPS))
    # the LLM's ranks in Megatron-Core's order: replica d's stage r at d + llm_dp * r
    encoders, stages = ranks[:encoder_ranks], ranks[encoder_ranks::llm_dp]
    # the loss lives on the LLM's last stage
    assert all(math.isnan(loss) for out in encoders for loss in out["losses"].values())
    for out in encoders[1:]:  # encoder replicas hold the same reduced state
        assert out["params"].keys() == encoders[0]["params"].keys()
    assert all(n.startswith("vision_model.") for n in encoders[0]["params"])
    assert_equal_runs([encoders[0]] + stages, ref, STEPS, holding="vision_model.")
    for step in (1, STEPS):  # each parameter counted once in the gradient norm
        squares = {}
        for out in ranks:
            for top, value in out["norm_squares"][step].items():
                squares[top] = squares.get(top, 0.0) + value
        assert squares == pytest.approx(ref["norm_squares"][step], rel=1e-4), step
    if auto:
        return
    # its checkpoint (model and optimizer) loads colocated on the LLM's layout (PP=2 on 2
    # ranks, the encoder on the first stage): the same weights
    at = argv.index("--load")
    argv = argv[:at] + ["--load", str(saved)] + [a for a in argv[at + 2:]
                                                 if a != "--no-load-optim"]
    loaded = run_distributed(train, 2, argv + SEPARATE[:2])
    assert all(out["iteration"] == STEPS for out in loaded)
    ours = merge_stages([encoders[0]] + stages, "params")
    theirs = merge_stages(loaded, "params")
    assert ours.keys() == theirs.keys()
    for name, value in theirs.items():
        assert torch.equal(ours[name], value), name
