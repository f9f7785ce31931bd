"""Qwen3-VL training (native-size images and videos through the frame-attention ViT,
DeepStack features added inside the LLM, interleaved M-RoPE) equals the single-process run
from the same initial checkpoint (losses, gradients) under TP=2, full recompute of the
LLM's layers (whose DeepStack hooks then run again in the backward), PP=2 with the cut
between two LLM layers that add DeepStack features (also PP=2 x VPP=2), cuts inside the
tower before a DeepStack layer (its kept outputs carried to the mergers), CP=2 (ours and
zigzag, with --vision-dp-when-cp, and PP=2 x CP=2: each CP rank adds the features at its
share of the sequence), TP=2 with sequence parallelism (also across a tower cut, and with
the tower on an encoder rank of its own), DP=2;
on packed, balanced micro-batches (--data-balance) at CP=2, PP=2 and DP=2; and with a
frozen tower; and the schedule executor's coarse / bubble schedules (trainable and frozen
tower, recompute, PP=2 x VPP=2, CP=2, --data-balance, encoder replicas at encoder TP 1
under TP 2) and the separate placement (the tower on an encoder rank of its own, the LLM at
PP=2 x VPP=2)."""

import pytest
import torch
from balanced_runs import assert_dp2_equals_both_ranks_plans
from dist_harness import run_distributed
from qwen_vl_data import write_qwen_vl_data
from equivalence import assert_same_answers
from train_workers import count_encoded_rows, record_answers, train

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
CP2 = ["--context-parallel-size", "2", "--context-parallel-block", "8"]
SP = ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--transformer-impl", "local"]
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
    # gradient comes back with the hidden state's); with full recompute, so the layers of
    # micro-batch 0 re-run after micro-batch 1's forward bound its features
    (2, ["--pipeline-model-parallel-size", "2", "--pipeline-partition", "7,3", *RECOMPUTE]),
    # PP=2 x VPP=2: [LLM embedding, the tower, its mergers] [LLM 0] [LLM 1] [LLM 2, head]:
    # both features leave the merging chunk, the second one passes through LLM 0's
    (2, ["--pipeline-model-parallel-size", "2", "--virtual-pipeline-model-parallel-size",
         "2", "--pipeline-partition", "6,1,1,2"]),
    # [LLM embedding, tower embedding, tower 0] [tower 1, 2, mergers, LLM]: tower layer
    # 0's output (a DeepStack feature) crosses the cut with the tower's hidden state
    (2, ["--pipeline-model-parallel-size", "2", "--pipeline-partition", "3,7"]),
    # PP=2 x VPP=2: [LLM embedding, the tower] [its mergers] [LLM 0, 1] [LLM 2, head]:
    # both DeepStack layers' outputs reach a chunk holding only the mergers
    (2, ["--pipeline-model-parallel-size", "2", "--virtual-pipeline-model-parallel-size",
         "2", "--pipeline-partition", "5,1,2,2"]),
    # each CP rank adds the features at its own share of the visual positions (split by
    # attention work, or zigzag), and its mergers get that share's gradient
    # (with full recompute: the CP attention's mask object goes through Megatron-Core's
    # checkpoint, patches/checkpoint_object_args.py)
    (2, CP2 + RECOMPUTE),
    (2, CP2 + ["--context-parallel-assignment", "zigzag"]),
    # each CP rank encodes its share of the items; the DeepStack features are gathered
    # over the CP ranks like the final merger's (their gradients summed back)
    (2, CP2 + ["--vision-dp-when-cp"]),
    # PP=2 x CP=2: LLM layer 1's feature crosses the cut whole, each CP rank adds its share
    (4, CP2 + ["--pipeline-model-parallel-size", "2", "--pipeline-partition", "7,3"]),
    # sequence parallelism: the tower's DeepStack outputs are shards, merged on the shard
    # and gathered; the features added to each TP rank's shard of the LLM's sequence
    (2, SP),
    # ... also across a cut inside the tower (the carried outputs are shards too)
    (4, SP + ["--pipeline-model-parallel-size", "2", "--pipeline-partition", "3,7"]),
    # ... and with the tower on an encoder rank of its own (rank 0): each LLM TP rank
    # takes its shard of the output and of the DeepStack outputs it receives whole
    (3, SP + ["--encoder-schedule", "separate"]),
    # data parallelism: two micro-batches per step, one on each rank
    (2, []),
], ids=["tp2", "recompute", "pp2-cut-between-deepstack-layers-recompute", "pp2-vpp2",
        "pp2-cut-inside-tower", "pp2-vpp2-mergers-alone", "cp2-recompute", "cp2-zigzag",
        "cp2-vision-dp", "pp2-cp2", "tp2-sp", "tp2-sp-pp2-cut-inside-tower",
        "separate-tp2-sp", "dp2"])
def test_parallel_layouts_equal_one_process(qwen3_vl_dir, reference, world, layout):
    common, ref = reference
    split = "--vision-dp-when-cp" in layout
    ranks = run_distributed(train, world, _argv(qwen3_vl_dir, *common, *layout), (1, STEPS),
                            count_encoded_rows if split else None)
    if split:  # the CP ranks embed disjoint shares of every micro-batch's patches
        first, second = (out["observed"]["encoded"] for out in ranks)
        assert len(first) == len(second) == 2 * STEPS
        for (a, tokens), (b, same) in zip(first, second):
            assert tokens == same and a + b == 4 * tokens and a and b, (first, second)
    _assert_equal_runs(ranks, layout, ref)
    # the DeepStack mergers and the tower layers feeding them are trained
    deepstack = [n for n in ref["grads"][1] if ".deepstack." in n]
    assert deepstack and all(ref["grads"][1][n].abs().sum() > 0 for n in deepstack)


def _assert_equal_runs(ranks, layout, ref):
    """The losses and gradients of ``ranks`` (a run of ``layout``) equal one process's:
    TP / CP / DP ranks hold the same (reduced) tensors, pipeline stages their own pieces
    (frozen parameters: none)."""
    world = len(ranks)
    stages = (ranks[::world // 2] if "--pipeline-model-parallel-size" in layout
              else ranks[:2] if "separate" in layout  # the encoder rank, the LLM's first
              else ranks[:1])
    for it in range(1, STEPS + 1):
        assert stages[-1]["losses"][it] == pytest.approx(ref["losses"][it], rel=1e-5), it
    # After an Adam step a parameter whose gradient was fp32 rounding moves by about lr,
    # so the second step's gradients differ by more than the first's (CP zigzag: 1.7e-6 in
    # a merger bias): as tests/equivalence.py compares parameters, 1e-5 there.
    for step, atol in ((1, 1e-6), (STEPS, 1e-5)):
        grads = {k: v for out in stages for k, v in out["grads"][step].items()}
        assert grads.keys() == ref["grads"][step].keys()
        for name, value in ref["grads"][step].items():
            if value is None:
                assert grads[name] is None, name
                continue
            torch.testing.assert_close(grads[name], value, rtol=1e-4, atol=atol,
                                       msg=lambda m: f"grads {step} {name}: {m}")


BALANCE = ["--data-balance", "isf-sorted", "--seq-length", "160"]


@pytest.fixture(scope="module")
def balanced_reference(qwen3_vl_dir, reference):
    """The one-process run from the saved init on packed micro-batches (--data-balance:
    several samples' images and videos in one row)."""
    common, _ = reference
    argv = _argv(qwen3_vl_dir, *common, *BALANCE)
    return argv, run_distributed(train, 1, argv, (1, STEPS))[0]


@pytest.mark.processes
@pytest.mark.parametrize("layout", [
    # packed documents over CP ranks: each adds the features at its share of every
    # document's visual positions
    CP2, CP2 + ["--context-parallel-assignment", "zigzag"],
    # packed rows of varying length with the carried DeepStack output through p2p
    ["--pipeline-model-parallel-size", "2", "--pipeline-partition", "3,7"],
], ids=["cp2", "cp2-zigzag", "pp2-cut-inside-tower"])
def test_balanced_packing_equals_one_process(balanced_reference, layout):
    argv, ref = balanced_reference
    _assert_equal_runs(run_distributed(train, 2, argv + layout, (1, STEPS)), layout, ref)


@pytest.mark.processes
def test_balanced_dp2_equals_one_process(qwen3_vl_dir, reference):
    """DP=2 on the packed plan equals one process on both ranks' packed micro-batches."""
    common, _ = reference
    assert_dp2_equals_both_ranks_plans(_argv(qwen3_vl_dir, *common, *BALANCE), STEPS)


@pytest.mark.processes
@pytest.mark.parametrize("world,layout", [
    # the frozen tower's carried DeepStack output takes no gradient; its merger does
    (2, ["--pipeline-model-parallel-size", "2", "--pipeline-partition", "3,7"]),
    (2, CP2 + ["--vision-dp-when-cp"]),
], ids=["pp2-cut-inside-tower", "cp2-vision-dp"])
def test_frozen_tower_equals_one_process(qwen3_vl_dir, reference, frozen_reference, world,
                                         layout):
    """A frozen tower (--freeze-ViT): it runs no backward, its DeepStack mergers train."""
    common, _ = reference
    ref = frozen_reference
    ranks = run_distributed(train, world, _argv(qwen3_vl_dir, *common, "--freeze-ViT",
                                                *layout), (1, STEPS))
    _assert_equal_runs(ranks, layout, ref)
    assert all(v is None for n, v in ref["grads"][1].items() if n.startswith("vision_model."))
    assert any(".deepstack." in n and v is not None for n, v in ref["grads"][1].items())


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
    # PP=2 x VPP=2: [embedding] [LLM 0] [LLM 1] [LLM 2, head]: both merged features leave
    # the first chunk, the second passes through LLM 0's; with the layers run again
    "bubble-vpp2-recompute": ["--encoder-schedule", "bubble",
                              "--virtual-pipeline-model-parallel-size", "2",
                              "--pipeline-partition", "1,1,1,2", *RECOMPUTE],
    # CP=2 (pieces [ViT 0-1 | ViT 2]): the merged features travel whole, each CP rank
    # adds its share of them
    "coarse-cp2": ["--encoder-schedule", "coarse", *CP2],
    # packed rows of several samples' images and videos (its own reference: BALANCE),
    # split over CP=2: each CP rank adds its share of every packed sample's features
    "bubble-cp2-data-balance": ["--encoder-schedule", "bubble", *CP2, *BALANCE],
    # the tower's pieces on encoder TP 1 under the LLM's TP 2 (replicas of the tower)
    "bubble-encoder-tp1": ["--encoder-schedule", "bubble", "--tensor-model-parallel-size",
                           "2", "--encoder-tensor-model-parallel-size", "1"],
    # the tower whole on an encoder rank of its own (rank 0) next to the LLM's PP=2 x VPP=2
    # [embedding, mergers] [LLM 0] [LLM 1] [LLM 2, head] on ranks 1-2: the tower's output
    # carries both DeepStack layers' outputs to the mergers, both merged features cross
    # the LLM's stage boundaries (the second through LLM 0's chunk); the gradients back
    "separate-vpp2": ["--encoder-schedule", "separate",
                      "--virtual-pipeline-model-parallel-size", "2",
                      "--pipeline-partition", "1,1,1,2"],
}


@pytest.mark.processes
@pytest.mark.parametrize("case", SCHEDULE_CASES)
def test_encoder_schedules_carry_deepstack(qwen3_vl_dir, reference, request,
                                           tmp_path_factory, case):
    common, ref = reference
    flags = SCHEDULE_CASES[case]
    if "--freeze-ViT" in flags:
        ref = request.getfixturevalue("frozen_reference")
    if "--data-balance" in flags:
        ref = request.getfixturevalue("balanced_reference")[1]
    if "--pipeline-partition" not in flags:
        flags = flags + ["--pipeline-partition", "2,3"]
    world = 2 * _size(flags, "--tensor-model-parallel-size") * _size(
        flags, "--context-parallel-size") + ("separate" in flags)  # its encoder rank
    layout = flags + ["--pipeline-model-parallel-size", "2"]
    if "separate" in flags:  # its val answer accuracy too, saved for a one-process decoding
        saved = str(tmp_path_factory.mktemp("separate"))
        layout = layout + ANSWER + ["--save", saved]
    ranks = run_distributed(train, world, _drop(_argv(qwen3_vl_dir, *common, *layout)),
                            (1, STEPS), record_answers if "separate" in flags else None)
    _assert_equal_runs(ranks, layout, ref)
    if "separate" in flags:  # the encoder rank sent each decoding batch's tower output
        # and DeepStack features once; the one process decodes them, at every step, alike
        at = common.index("--load")
        argv = common[:at] + ["--load", saved] + ANSWER
        one = run_distributed(train, 1, _drop(_argv(qwen3_vl_dir, *argv)), (),
                              record_answers)[0]
        assert_same_answers(ranks[-1:], one, 4)


# the val answer accuracy at the end (greedy decoding), not only the loss
ANSWER = ["--eval-max-new-tokens", "2"]


def _drop(argv):
    """``argv`` evaluating at the end when it decodes (``ANSWER``)."""
    return [a for a in argv if not (ANSWER[0] in argv and a == "--skip-final-eval")]


def _size(flags, flag):
    return int(flags[flags.index(flag) + 1]) if flag in flags else 1
