"""Qwen3-VL-MoE training (Qwen3-VL's tower and DeepStack in front of an MoE LLM: layers
MoE, dense, MoE, DeepStack added after the first two) at EP=2, TP=2 x EP=2 (sequence
parallelism: DeepStack's features added to the shards) and CP=2 x EP=2 (sequences split in
blocks of 8) equals the one-process run from the same initial checkpoint: losses,
gradients, parameters, the load-balancing loss and the tokens per expert."""

import pytest
from dist_harness import run_distributed
from equivalence import assert_equal_runs, assert_same_moe_losses
from qwen_vl_data import write_qwen_vl_data
from test_qwen3_vl_training import CP2, QWEN3_VL_MODEL, SP
from train_workers import train

pytestmark = pytest.mark.processes

STEPS = 2
MOE = ["--num-experts", "4", "--moe-ffn-hidden-size", "32", "--moe-layer-freq", "[1,0,1]",
       "--moe-router-topk", "2", "--moe-aux-loss-coeff", "0.01",
       "--moe-token-dispatcher-type", "alltoall"]
EP2 = ["--expert-model-parallel-size", "2"]
# one launch each; the experts whole on each TP rank (ETP 1: gloo's all-gather does not
# take the uneven token counts ETP 2 gathers)
LAYOUTS = [(2, EP2), (4, EP2 + SP + ["--expert-tensor-parallel-size", "1"]),
           (2, EP2 + CP2)]


def test_expert_parallel_equals_one_process(tmp_path):
    data = write_qwen_vl_data(str(tmp_path), unit=32)
    argv = QWEN3_VL_MODEL + MOE + ["--data-path", data, "--micro-batch-size", "2",
                                   "--global-batch-size", "4",
                                   "--make-vocab-size-divisible-by", "64",
                                   # Adam's eps above the fp32 noise (~1e-10) of gradients
                                   # near 0 (patch weights of edge pixels), which 1e-8
                                   # would turn into steps differing by lr / 50
                                   "--adam-eps", "1e-6"]
    init = str(tmp_path / "init")
    run_distributed(train, 1, argv + ["--train-iters", "0", "--save", init])
    argv += ["--train-iters", str(STEPS), "--load", init, "--no-load-optim"]
    ref = run_distributed(train, 1, argv, (1, STEPS))[0]
    for world, layout in LAYOUTS:
        ranks = run_distributed(train, world, argv + layout, (1, STEPS))
        # rank 0: TP rank 0, its tensors TP-gathered
        assert_equal_runs(ranks[:1], ref, STEPS, holding="language_model.decoder.layers.2"
                          ".mlp.experts.local_experts.3")
        assert all(ref["moe_losses"][it]["load_balancing_loss"] > 0
                   for it in range(1, STEPS + 1))
        assert_same_moe_losses(ranks, ref, STEPS, where=(world, layout))
    deepstack = [n for n in ref["grads"][1] if ".deepstack." in n]
    assert deepstack and all(ref["grads"][1][n].abs().sum() > 0 for n in deepstack)
