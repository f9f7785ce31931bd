"""Qwen3.5 training (Qwen3-VL's tower without DeepStack, the hybrid LLM: Gated DeltaNet
layers 0 and 2, gated full attention with a quarter-head interleaved M-RoPE at 1 and 3,
zero-centred norms) equals the single-process run from the same initial checkpoint
(losses, gradients) under TP=2 with sequence parallelism (GDN's key / value heads split
over the ranks, its in_proj per rank [q k v z b a]), PP=2 cut between a linear and a
full-attention layer, PP=2 x VPP=2, DP=2; on packed micro-batches (--data-balance: the
GDN state restarts at every sample) at PP=2; the schedule executor's coarse schedule and
the bubble schedule with a frozen tower."""

import pytest
import torch
from dist_harness import run_distributed
from qwen_vl_data import write_qwen_vl_data
from qwen3_5_model import QWEN3_5_MODEL
from train_workers import train

STEPS = 2
KEY, VALUE = 2 * 16, 4 * 16  # GDN's q / k and v / z widths (2 key, 4 value heads of 16)
SP = ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--transformer-impl", "local"]
BALANCE = ["--data-balance", "isf-sorted", "--seq-length", "160"]
PP2 = ["--pipeline-model-parallel-size", "2"]


@pytest.fixture(scope="module")
def qwen3_5_dir(tmp_path_factory):
    return write_qwen_vl_data(str(tmp_path_factory.mktemp("qwen3_5")), unit=32)


def _argv(data, *extra):
    return QWEN3_5_MODEL + ["--data-path", data, "--micro-batch-size", "2",
                            "--global-batch-size", "4", "--make-vocab-size-divisible-by",
                            "64", *extra]


@pytest.fixture(scope="module")
def reference(qwen3_5_dir, tmp_path_factory):
    init = str(tmp_path_factory.mktemp("init"))
    run_distributed(train, 1, _argv(qwen3_5_dir, "--train-iters", "0", "--save", init))
    common = ["--train-iters", str(STEPS), "--load", init, "--no-load-optim"]
    return common, run_distributed(train, 1, _argv(qwen3_5_dir, *common), (1, STEPS))[0]


def _tp_canonical(name: str, value, tp: int):
    """A GDN tensor gathered from ``tp`` ranks (each holds its heads' [q k v z b a] rows of
    in_proj, [q k v] channels of conv1d) in the one process's order."""
    if tp == 1 or value is None:
        return value
    if name.endswith("self_attention.in_proj.weight"):
        sizes = (KEY, KEY, VALUE, VALUE, 4, 4)
    elif name.endswith("self_attention.conv1d.weight"):
        sizes = (KEY, KEY, VALUE)
    else:
        return value
    ranks = [r.split([s // tp for s in sizes]) for r in value.chunk(tp)]
    return torch.cat([ranks[r][k] for k in range(len(sizes)) for r in range(tp)])


def _assert_equal_runs(ranks, layout, ref):
    world = len(ranks)
    pp = "--pipeline-model-parallel-size" in layout
    stages = ranks[::world // 2] if pp else ranks[:1]
    tp = 2 if "--tensor-model-parallel-size" in layout else 1
    for it in range(1, STEPS + 1):
        assert stages[-1]["losses"][it] == pytest.approx(ref["losses"][it], rel=1e-5), it
    for step, atol in ((1, 1e-6), (STEPS, 1e-5)):
        grads = {k: _tp_canonical(k, v, tp) for out in stages
                 for k, v in out["grads"][step].items()}
        assert grads.keys() == ref["grads"][step].keys()
        for name, value in ref["grads"][step].items():
            if value is None:
                assert grads[name] is None, name
                continue
            torch.testing.assert_close(grads[name], value, rtol=1e-4, atol=atol,
                                       msg=lambda m: f"grads {step} {name}: {m}")


@pytest.mark.processes
@pytest.mark.parametrize("layout", [
    SP,
    # [LLM embedding, tower embedding, tower 0-1, merger, LLM 0 (GDN)] [LLM 1 (full),
    # LLM 2 (GDN), LLM 3 (full), head]
    PP2 + ["--pipeline-partition", "6,4"],
    # [.., merger] [LLM 0, 1] [LLM 2] [LLM 3, head]
    PP2 + ["--virtual-pipeline-model-parallel-size", "2", "--pipeline-partition", "5,2,1,2"],
    [],  # DP=2
    # the tower as its own pipeline run by the schedule executor, all in the big bubbles;
    # the LLM as [embedding, LLM 0] [LLM 1-3, head]
    PP2 + ["--encoder-schedule", "coarse", "--pipeline-partition", "2,4"],
], ids=["tp2-sp", "pp2-cut-linear-full", "pp2-vpp2", "dp2", "coarse"])
def test_parallel_layouts_equal_one_process(qwen3_5_dir, reference, layout):
    common, ref = reference
    ranks = run_distributed(train, 2, _argv(qwen3_5_dir, *common, *layout), (1, STEPS))
    _assert_equal_runs(ranks, layout, ref)
    gdn = [n for n in ref["grads"][1] if n.endswith("self_attention.A_log")]
    assert len(gdn) == 2 and all(ref["grads"][1][n].abs().sum() > 0 for n in gdn)


@pytest.mark.processes
def test_packed_rows_equal_one_process(qwen3_5_dir, reference):
    """--data-balance packs several samples in a row; PP=2 (cut linear | full) on them
    equals one process on them."""
    common, _ = reference
    argv = _argv(qwen3_5_dir, *common, *BALANCE)
    ref = run_distributed(train, 1, argv, (1, STEPS))[0]
    layout = PP2 + ["--pipeline-partition", "6,4"]
    _assert_equal_runs(run_distributed(train, 2, argv + layout, (1, STEPS)), layout, ref)


@pytest.mark.processes
def test_bubble_schedule_frozen_tower_equals_one_process(qwen3_5_dir, reference):
    """The bubble schedule with the tower frozen (--freeze-ViT: forward only, its merger
    trains) equals one process with the tower frozen."""
    common, _ = reference
    frozen = _argv(qwen3_5_dir, *common, "--freeze-ViT")
    ref = run_distributed(train, 1, frozen, (1, STEPS))[0]
    layout = PP2 + ["--encoder-schedule", "bubble", "--pipeline-partition", "2,4"]
    _assert_equal_runs(run_distributed(train, 2, frozen + layout, (1, STEPS)), layout, ref)
    assert all(v is None for n, v in ref["grads"][1].items() if n.startswith("vision_model."))


MOE = ["--num-experts", "4", "--moe-ffn-hidden-size", "24", "--moe-router-topk", "2",
       "--moe-shared-expert-intermediate-size", "40", "--moe-shared-expert-gate",
       "--moe-aux-loss-coeff", "0.01", "--moe-token-dispatcher-type", "alltoall",
       "--adam-eps", "1e-6"]


@pytest.mark.processes
def test_moe_expert_parallel_equals_one_process(qwen3_5_dir, tmp_path):
    """Qwen3.5-MoE (every layer MoE with a gated shared expert, GDN and full attention
    alike) at EP=2 equals one process: losses, gradients, parameters, the load-balancing
    loss and the tokens per expert."""
    from equivalence import assert_equal_runs, assert_same_moe_losses

    argv = _argv(qwen3_5_dir, *MOE)
    init = str(tmp_path / "init")
    run_distributed(train, 1, argv + ["--train-iters", "0", "--save", init])
    argv += ["--train-iters", str(STEPS), "--load", init, "--no-load-optim"]
    ref = run_distributed(train, 1, argv, (1, STEPS))[0]
    ranks = run_distributed(train, 2, argv + ["--expert-model-parallel-size", "2"],
                            (1, STEPS))
    assert_equal_runs(ranks[:1], ref, STEPS,
                      holding="language_model.decoder.layers.0.mlp.experts.local_experts.3")
    assert_same_moe_losses(ranks, ref, STEPS)
    shared = [n for n in ref["grads"][1] if n.endswith("shared_experts.gate_weight")]
    assert len(shared) == 4 and all(ref["grads"][1][n].abs().sum() > 0 for n in shared)
