"""Qwen3-VL training (native-size images and videos through the frame-attention ViT,
DeepStack features added inside the LLM, interleaved M-RoPE) equals the single-process run
from the same initial checkpoint (losses, gradients, parameters) under TP=2 and with full
recompute of the LLM's layers (whose DeepStack hooks then run again in the backward), and
PP=2 with the cut between two LLM layers that add DeepStack features (also interleaved,
PP=2 x VPP=2)."""

import pytest
import torch
from dist_harness import run_distributed
from qwen_vl_data import write_qwen_vl_data
from train_workers import train

STEPS = 2
# A 3-layer tower whose layers 0 and 1 feed DeepStack (added after LLM layers 0 and 1 of
# 3); 32 x 32 pixel merge units; a Qwen3 LLM (q / k norms, head 16) with interleaved M-RoPE.
QWEN3_VL_MODEL = [
    "--num-layers", "3", "--hidden-size", "64", "--ffn-hidden-size", "128",
    "--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "2",
    "--kv-channels", "16", "--qk-layernorm", "--untie-embeddings-and-output-weights",
    "--seq-length", "96", "--vision-model-type", "qwen3_vl", "--vision-hidden-size", "32",
    "--vision-num-layers", "3", "--vision-num-attention-heads", "2",
    "--vision-ffn-hidden-size", "64", "--patch-dim", "16",
    "--vision-deepstack-visual-indexes", "0", "1", "--vision-num-position-embeddings", "16",
    "--min-pixels", "1024", "--max-pixels", "9216", "--video-min-pixels", "1024",
    "--video-max-pixels", "4096", "--position-embedding-type", "mrope",
    "--mrope-section", "2", "3", "3", "--mrope-interleaved",
    "--lr", "1e-3", "--lr-decay-style", "constant", "--weight-decay", "0.0",
    "--log-interval", "1", "--eval-iters", "1", "--skip-final-eval",
]
RECOMPUTE = ["--recompute-granularity", "full", "--recompute-method", "uniform",
             "--recompute-num-layers", "1"]


@pytest.fixture(scope="module")
def qwen3_vl_dir(tmp_path_factory):
    return write_qwen_vl_data(str(tmp_path_factory.mktemp("qwen3_vl")), unit=32)


def _argv(data, *extra):
    return QWEN3_VL_MODEL + ["--data-path", data, "--micro-batch-size", "2",
                             "--global-batch-size", "4", "--make-vocab-size-divisible-by",
                             "64", *extra]


@pytest.fixture(scope="module")
def reference(qwen3_vl_dir, tmp_path_factory):
    init = str(tmp_path_factory.mktemp("init"))
    run_distributed(train, 1, _argv(qwen3_vl_dir, "--train-iters", "0", "--save", init))
    common = ["--train-iters", str(STEPS), "--load", init, "--no-load-optim"]
    return common, run_distributed(train, 1, _argv(qwen3_vl_dir, *common), (1, STEPS))[0]


@pytest.mark.processes
@pytest.mark.parametrize("world,layout", [
    (2, ["--tensor-model-parallel-size", "2"]),
    (1, RECOMPUTE),
    # [LLM embedding, the tower, its mergers, LLM layer 0] [LLM layers 1, 2, head]: the
    # DeepStack feature of LLM layer 1 crosses the cut with the hidden state (and its
    # gradient comes back with the hidden state's)
    (2, ["--pipeline-model-parallel-size", "2", "--pipeline-partition", "7,3"]),
    # PP=2 x VPP=2: [LLM embedding, the tower, its mergers] [LLM 0] [LLM 1] [LLM 2, head]:
    # both features leave the merging chunk, the second one passes through LLM 0's
    (2, ["--pipeline-model-parallel-size", "2", "--virtual-pipeline-model-parallel-size",
         "2", "--pipeline-partition", "6,1,1,2"]),
], ids=["tp2", "recompute", "pp2-cut-between-deepstack-layers", "pp2-vpp2"])
def test_parallel_layouts_equal_one_process(qwen3_vl_dir, reference, world, layout):
    common, ref = reference
    ranks = run_distributed(train, world, _argv(qwen3_vl_dir, *common, *layout), (1, STEPS))
    # TP ranks hold the same (gathered) tensors; pipeline stages their own pieces
    stages = ranks if "--pipeline-model-parallel-size" in layout else ranks[:1]
    for it in range(1, STEPS + 1):
        assert stages[-1]["losses"][it] == pytest.approx(ref["losses"][it], rel=1e-5), it
    for step in (1, STEPS):
        grads = {k: v for out in stages for k, v in out["grads"][step].items()}
        assert grads.keys() == ref["grads"][step].keys()
        for name, value in ref["grads"][step].items():
            torch.testing.assert_close(grads[name], value, rtol=1e-4, atol=1e-6,
                                       msg=lambda m: f"grads {step} {name}: {m}")
    # the DeepStack mergers and the tower layers feeding them are trained
    deepstack = [n for n in ref["grads"][1] if ".deepstack." in n]
    assert deepstack and all(ref["grads"][1][n].abs().sum() > 0 for n in deepstack)


def test_sequence_parallel_is_refused(capsys):
    from megatron_mm.training.arguments import parse_args

    with pytest.raises(SystemExit):
        parse_args(QWEN3_VL_MODEL + ["--tensor-model-parallel-size", "2",
                                     "--sequence-parallel"], world_size=2)
    assert ("--sequence-parallel: the vision encoder's DeepStack features are added to the "
            "whole sequence") in capsys.readouterr().err


@pytest.fixture(scope="module")
def frozen_reference(qwen3_vl_dir, reference):
    """One process from the same init with the tower frozen (its mergers train)."""
    common, _ = reference
    return run_distributed(train, 1, _argv(qwen3_vl_dir, *common, "--freeze-ViT"),
                           (1, STEPS))[0]


# The tower as its own pipeline, run by the schedule executor: [ViT 0 | ViT 1-2] over
# the two ranks, the LLM as [embedding, LLM 0] [LLM 1-2, head]. The pieces carry the
# outputs of ViT layers 0 and 1 to the mergers on the LLM's first chunk, which sends LLM
# layer 1's merged feature on with the hidden state; the gradients come back the same
# ways. One launch per case.
SCHEDULE_CASES = {
    "coarse": ["--encoder-schedule", "coarse"],
    "bubble": ["--encoder-schedule", "bubble"],
    "coarse-frozen-vit": ["--encoder-schedule", "coarse", "--freeze-ViT"],
    "bubble-frozen-vit": ["--encoder-schedule", "bubble", "--freeze-ViT"],
    # the pieces' layers (and their DeepStack hooks) run again in their backward
    "bubble-recompute": ["--encoder-schedule", "bubble", *RECOMPUTE],
}


@pytest.mark.processes
@pytest.mark.parametrize("case", SCHEDULE_CASES)
def test_encoder_schedules_carry_deepstack(qwen3_vl_dir, reference, frozen_reference, case):
    common, ref = reference
    flags = SCHEDULE_CASES[case]
    if "--freeze-ViT" in flags:
        ref = frozen_reference
    ranks = run_distributed(train, 2, _argv(qwen3_vl_dir, *common, *flags,
                                            "--pipeline-model-parallel-size", "2",
                                            "--pipeline-partition", "2,3"), (1, STEPS))
    for it in range(1, STEPS + 1):
        assert ranks[-1]["losses"][it] == pytest.approx(ref["losses"][it], rel=1e-5), it
    for step in (1, STEPS):
        grads = {k: v for out in ranks for k, v in out["grads"][step].items()}
        assert grads.keys() == ref["grads"][step].keys()
        for name, value in ref["grads"][step].items():
            torch.testing.assert_close(grads[name], value, rtol=1e-4, atol=1e-6,
                                       msg=lambda m: f"grads {step} {name}: {m}")
