"""Pipeline layouts equal one process from the same initial checkpoint (losses, gradients,
parameters): PP=2 with Megatron's layout (encoder on the first stage), with the ViT split
across stages, with the frozen-aware partition and with the partition OmniBal's search
times and keeps (its trial iterations leave the run's init and data order alone); PP=2 x VPP=2 and
PP=4 with encoder-only middle chunks; TP=2 x PP=2; the encoder as its own pipeline (coarse and
bubble schedules), also at encoder TP 1 inside TP 2 (two encoder replicas; its checkpoint then loads
at TP=1 and evaluates the same) and with full recompute reaching the encoder pieces. A frozen ViT
runs no backward on any stage it spans. Ranks run in strict p2p mode; the encoder schedules also
with NCCL's one Work per batch (``runtime/nccl_coalescing.py``), where a message read before its
batch is waited for is garbage."""

import pytest
import torch
from dist_harness import NCCL_COALESCING, run_distributed
from equivalence import REFERENCE_STEPS as STEPS
from equivalence import assert_norm_counted_once, merge_stages
from plans import plan_of, slow_link_profile
from train_workers import count_vit_layer_calls, train

pytestmark = pytest.mark.processes

PP2 = ["--pipeline-model-parallel-size", "2"]
PP4 = ["--pipeline-model-parallel-size", "4"]
SPLIT_VIT = ["--pipeline-partition", "3,5"]  # [embedding, ViT embed, ViT 0] [ViT 1, ...]
FOUR_LAYERS = ["--num-layers", "4"]  # chain: 1 + 1 + 2 + 1 + 4 + 1 = 10
COARSE = ["--encoder-schedule", "coarse"]
BUBBLE = ["--encoder-schedule", "bubble"]
ETP1 = ["--encoder-tensor-model-parallel-size", "1"]
# --encoder-schedule auto on a measured profile (written by the test) whose ViT is slow
AUTO = ["--encoder-schedule", "auto", "--pipeline-profile", "SLOW_VIT_PROFILE"]
# ... at TP 2 on a profile whose TP links are slow: auto picks the ViT at TP 1 (replicas)
AUTO_ETP = ["--tensor-model-parallel-size", "2"] + AUTO
# the ViT interleaved over the two ranks: 4 layers in 4 ranges, 2 per rank (one per round)
INTERLEAVED = ["--encoder-virtual-pipeline-model-parallel-size", "2"]
FOUR_VIT_LAYERS = ["--vision-num-layers", "4"]
RECOMPUTE = ["--recompute-granularity", "full", "--recompute-method", "block",
             "--recompute-num-layers", "1"]


@pytest.mark.parametrize("world, layout, model", [
    (2, PP2, []),
    (2, PP2 + SPLIT_VIT, []),
    (4, PP2 + ["--tensor-model-parallel-size", "2"], []),
    # frozen-aware: [everything but the output layer] [output layer + loss]
    (2, PP2 + ["--pipeline-partition", "auto"], ["--freeze-ViT"]),
    # search: 2 of the anchor's +-1 neighbours timed for 2 real iterations each
    (2, PP2 + ["--pipeline-partition", "search", "--pipeline-search-candidates", "2",
               "--pipeline-search-iters", "2"], ["--freeze-ViT"]),
    # [embedding, ViT embed, ViT 0] [ViT 1, projector] [LLM 0-2] [LLM 3, output]
    (2, PP2 + ["--virtual-pipeline-model-parallel-size", "2", "--pipeline-partition",
               "3,2,3,2"], FOUR_LAYERS + ["--freeze-ViT"]),
    # [embedding, ViT embed] [ViT 0-1] [projector, LLM 0-1] [LLM 2-3, output]
    (4, PP4 + ["--pipeline-partition", "2,2,3,3"], FOUR_LAYERS + ["--freeze-ViT"]),
    # The ViT as its own pipeline, run by the schedule executor (--encoder-schedule):
    # [ViT 0 | ViT 1] over the two ranks, all forwards first (coarse) or in the bubbles
    (2, PP2 + COARSE, []),
    (4, PP2 + ["--tensor-model-parallel-size", "2"] + BUBBLE, []),
    # DP=2: each chunk's gradient all-reduce starts after its last backward action and
    # runs under the rest of the schedule (the encoder's backward pieces)
    (4, PP2 + BUBBLE + ["--overlap-grad-reduce"], []),
    # --recompute-granularity full reaches the encoder pieces too (their layers run twice)
    (2, PP2 + BUBBLE + RECOMPUTE, []),
    # the ViT at TP 1 in TP 2: two replicas per TP group, each for half the micro-batches
    (4, PP2 + ["--tensor-model-parallel-size", "2"] + BUBBLE + ETP1, []),
    # both ViT layers as two pieces on rank 0, the LLM interleaved over 4 chunks
    (2, PP2 + ["--virtual-pipeline-model-parallel-size", "2"] + BUBBLE +
     ["--encoder-pipeline-model-parallel-size", "1", "--encoder-pieces", "2"],
     FOUR_LAYERS + ["--freeze-ViT"]),
    # ViT 0 on rank 0, ViT 1 on rank 2
    (4, PP4 + BUBBLE + ["--encoder-pipeline-model-parallel-size", "2"],
     FOUR_LAYERS + ["--freeze-ViT"]),
    # the planner picks the schedule from the profile: the ViT as its own pipeline
    (2, PP2 + AUTO, []),
    (4, PP2 + AUTO_ETP, []),
    # the ViT placed from the last rank: [ViT 0 on rank 1 | ViT 1 on rank 0], its layers
    # laid out over mirrored ranks (global names, as from the first rank)
    (2, PP2 + BUBBLE + ["--encoder-placement", "last"], []),
    # interleaved from the last rank: [ViT 0 on rank 1 | 1 on 0 | 2 on 1 | 3 on 0]
    (2, PP2 + BUBBLE + INTERLEAVED + ["--encoder-placement", "last"], FOUR_VIT_LAYERS),
    # ... with the LLM interleaved too, from the first rank
    (2, PP2 + BUBBLE + INTERLEAVED + ["--virtual-pipeline-model-parallel-size", "2",
                                      "--encoder-placement", "first"],
     FOUR_VIT_LAYERS + FOUR_LAYERS),
], ids=["pp2", "pp2-split-vit", "tp2-pp2", "pp2-auto-frozen-vit", "pp2-search-frozen-vit",
        "pp2-vpp2-split-frozen-vit", "pp4-frozen-vit", "pp2-coarse", "tp2-pp2-bubble",
        "dp2-pp2-bubble-overlap", "pp2-bubble-recompute", "tp2-pp2-bubble-etp1",
        "pp2-vpp2-bubble-frozen-vit", "pp4-bubble-frozen-vit", "pp2-auto-slow-vit",
        "tp2-pp2-auto-etp1", "pp2-bubble-placed-last", "pp2-bubble-encoder-vpp2-last",
        "pp2-vpp2-bubble-encoder-vpp2"])
def test_pipeline_parallel_equals_one_process(one_process_reference, digits_dir,
                                              tmp_path_factory, world, layout, model,
                                              env=None):
    # Stages draw different random streams, so both runs start from one saved init.
    argv, ref = one_process_reference(digits_dir, model)
    if AUTO[-1] in layout:
        layout = _with_slow_vit_profile(argv, layout, tmp_path_factory)
    extra = []
    replicas = layout[-2:] == ETP1
    # save, and evaluate (forward-only runs skip other replicas; interleaved ranges load
    # under one block's keys)
    if replicas or (INTERLEAVED[0] in layout and "--encoder-placement" in layout[-2:]):
        saved = tmp_path_factory.mktemp("etp1")
        extra = ["--save", str(saved)]
        argv = [a for a in argv if a != "--skip-final-eval"] + ["--eval-max-new-tokens", "2"]
    ranks = run_distributed(train, world, argv + layout + extra, (1, STEPS),
                            count_vit_layer_calls, env=env)
    pp = 4 if layout[:2] == PP4[:2] else 2
    stages = ranks[:: world // pp]  # TP rank 0 of each stage: full (TP-gathered) tensors
    last = stages[-1]  # the loss lives on the last stage
    if "search" in layout:  # a timed candidate, the same on every rank
        assert isinstance(last["pipeline_partition"], list), last["pipeline_partition"]
        assert all(out["pipeline_partition"] == last["pipeline_partition"] for out in ranks)
    for it in range(1, STEPS + 1):
        assert last["losses"][it] == pytest.approx(ref["losses"][it], rel=1e-5), it
    for what, step, atol in (("grads", 1, 1e-6), ("grads", STEPS, 1e-6), ("params", None, 1e-5)):
        ours = merge_stages(stages, what, step)
        theirs = ref[what] if step is None else ref[what][step]
        assert ours.keys() == theirs.keys()
        for name, value in theirs.items():
            if value is None:
                assert ours[name] is None, name
                continue
            torch.testing.assert_close(ours[name], value, rtol=1e-4, atol=atol,
                                       msg=lambda m: f"{what} {step} {name}: {m}")
    assert_norm_counted_once(ranks, ref, STEPS)
    calls = [out["observed"]["vit_calls"] for out in stages]
    assert sum(c["layers"] for c in calls) == (4 if FOUR_VIT_LAYERS[0] in model else 2)
    for c in calls:
        if c["layers"]:
            assert c["fwd"] > 0, calls
            # frozen: autograd never enters the ViT, on whichever stage it runs
            assert (c["bwd"] == 0) == ("--freeze-ViT" in model), calls
            if RECOMPUTE[1] in layout:  # one ViT layer per rank, recomputed: twice per
                assert c["fwd"] == 2 * 4 * STEPS, calls  # micro-batch (4 per step)
    if replicas:  # both encoder replicas of the first stage did encoder work
        for out in ranks[:2]:
            c = out["observed"]["vit_calls"]
            assert c["fwd"] > 0 and c["bwd"] > 0, c
    if extra:
        _check_etp1_checkpoint(argv, saved, stages)


@pytest.mark.parametrize("world, layout, model", [
    (2, PP2 + COARSE, []),
    (2, PP2 + ["--virtual-pipeline-model-parallel-size", "2"] + BUBBLE +
     ["--encoder-pipeline-model-parallel-size", "1", "--encoder-pieces", "2"],
     FOUR_LAYERS + ["--freeze-ViT"]),
    (4, PP2 + ["--tensor-model-parallel-size", "2"] + BUBBLE + ETP1, []),
    (4, PP4 + BUBBLE + ["--encoder-pipeline-model-parallel-size", "2"],
     FOUR_LAYERS + ["--freeze-ViT"]),
], ids=["pp2-coarse", "pp2-vpp2-bubble-frozen-vit", "tp2-pp2-bubble-etp1",
        "pp4-bubble-frozen-vit"])
def test_encoder_schedules_equal_one_process_with_nccl_coalescing(
        one_process_reference, digits_dir, tmp_path_factory, world, layout, model):
    """The schedule executor's exchanges with NCCL's one Work per batch, each received
    tensor holding its data only once that Work is waited for, and no strict-mode waits:
    a message used before its batch is waited for gives wrong numbers."""
    test_pipeline_parallel_equals_one_process(one_process_reference, digits_dir,
                                              tmp_path_factory, world, layout, model,
                                              env=NCCL_COALESCING)


def _with_slow_vit_profile(argv, layout, tmp_path_factory):
    """The layout with a profile in which ViT layers take 20x an LLM layer, and the choice
    --encoder-schedule auto makes on it: an encoder pipeline of its own. With TP 2
    (``AUTO_ETP``), a profile whose TP links are slow: auto runs the ViT at TP 1."""
    from megatron_mm.plan.pipeline.profile import LayerProfile, LayerTime

    path = tmp_path_factory.mktemp("profile") / "profile.json"
    base = argv + [a for a in layout if a not in AUTO]
    world = 4 if "--tensor-model-parallel-size" in layout else 2
    etp_case = layout[-len(AUTO_ETP):] == AUTO_ETP
    if etp_case:
        slow_link_profile(base, world, path)
    else:
        config, plan = plan_of(base, world)
        LayerProfile("test", config.training.micro_batch_size, config.model.seq_length, 1, [], [
            LayerTime(l.module, 20e-3 if "vision" in l.module else 1e-3,
                      40e-3 if "vision" in l.module else 2e-3) for l in plan.chain]
        ).save(str(path))
    layout = [str(path) if a == AUTO[-1] else a for a in layout]
    _, chosen = plan_of(argv + layout, world)
    assert chosen.schedule.encoder_schedule in ("coarse", "bubble"), chosen.schedule.lines()
    if etp_case:
        assert chosen.schedule.encoder_tensor_model_parallel_size == 1, chosen.schedule.lines()
    return layout


def _check_etp1_checkpoint(argv, saved, stages):
    """The TP=2 / ETP=1 (or interleaved encoder's) checkpoint (model and optimizer) loads in
    one process: the same parameters, and the same validation loss and answers."""
    at = argv.index("--load")
    argv = argv[:at] + ["--load", str(saved)] + [a for a in argv[at + 2:]
                                                 if a != "--no-load-optim"]
    loaded = run_distributed(train, 1, argv)[0]
    assert loaded["iteration"] == STEPS
    ours = merge_stages(stages, "params")
    assert ours.keys() == loaded["params"].keys()
    for name, value in loaded["params"].items():
        assert torch.equal(ours[name], value), name
    assert stages[-1]["val_loss"] == pytest.approx(loaded["val_loss"], rel=1e-5)
    assert stages[-1]["val_accuracy"] == loaded["val_accuracy"]
