"""Qwen2.5-VL training (native-size images and videos through the window-attention ViT,
M-RoPE in the LLM) equals the single-process run from the same initial checkpoint (losses,
gradients, parameters) under TP=2, PP=2 with the ViT cut between its two layers, PP=2 with
the ViT in the LLM's bubbles (also at encoder TP 1 in TP 2) or coarse, CP=2 (also with
each CP rank encoding its share of the items, --vision-dp-when-cp), full recompute, a frozen
ViT over PP=2 x VPP=2 (and over CP=2 with --vision-dp-when-cp), TP=2 with sequence
parallelism (also across a ViT cut, and with the ViT on an encoder rank of its own,
--encoder-schedule separate), and on packed micro-batches balanced on patches
(--data-balance) at PP=2 and at DP=2 (one process on both ranks' plans); the model reads no
device value."""

import pytest
import torch
from balanced_runs import assert_dp2_equals_both_ranks_plans
from dist_harness import run_distributed
from qwen_vl_data import QWEN_VL_MODEL, write_qwen_vl_data
from train_workers import (TINY_MODEL, count_encoded_rows, count_vit_calls_and_host_syncs,
                           count_vit_layer_calls, train)

STEPS = 2
# The layouts whose runs also check that the model reads no device value.
HOST_SYNC_FREE = ("pp2-split-vit", "pp2-bubble", "tp2-sp")
RECOMPUTE = ["--recompute-granularity", "full", "--recompute-method", "block",
             "--recompute-num-layers", "1"]


@pytest.fixture(scope="module")
def qwen_vl_dir(tmp_path_factory):
    return write_qwen_vl_data(str(tmp_path_factory.mktemp("qwen_vl")))


def _argv(data, *extra):
    return TINY_MODEL + QWEN_VL_MODEL + [
        "--data-path", data, "--micro-batch-size", "2", "--global-batch-size", "4",
        "--make-vocab-size-divisible-by", "64", *extra]


@pytest.fixture(scope="module")
def reference(qwen_vl_dir, tmp_path_factory):
    """The saved initial checkpoint and the one-process run from it, for each data path
    (padded micro-batches, or packed balanced ones), its host syncs counted."""
    init = str(tmp_path_factory.mktemp("init"))
    run_distributed(train, 1, _argv(qwen_vl_dir, "--train-iters", "0", "--save", init))
    common = ["--train-iters", str(STEPS), "--load", init, "--no-load-optim"]
    padded = run_distributed(train, 1, _argv(qwen_vl_dir, *common), (1, STEPS),
                             count_vit_calls_and_host_syncs)[0]
    return common, padded


def _assert_no_host_syncs(ranks):
    """The windows, masks, rotary positions and packed shapes come from the host layout:
    the model reads no device value."""
    for rank, out in enumerate(ranks):
        counted = out["observed"]["host_syncs"]
        assert counted["scopes"] > 0 and counted["found"] == [], (rank, counted)


def _merge(ranks, key, step=None):
    merged = {}
    for out in ranks:
        merged.update(out[key] if step is None else out[key][step])
    return merged


def _assert_equal_runs(stages, ref):
    last = stages[-1]
    for it in range(1, STEPS + 1):
        assert last["losses"][it] == pytest.approx(ref["losses"][it], rel=1e-5), it
    # Parameters after Adam: its normalised update turns fp32 summation-order noise in a
    # near-zero gradient element into up to ~lr x 1% per step (1.6e-5 seen after 2 steps at
    # lr 1e-3 with CP=2); a layout bug (a gradient not reduced, an update skipped) moves
    # elements by ~lr. The gradients above carry the fp32 equivalence.
    for what, step, atol in (("grads", 1, 1e-6), ("grads", STEPS, 1e-6), ("params", None, 1e-4)):
        ours, theirs = _merge(stages, what, step), (ref[what] if step is None
                                                    else ref[what][step])
        assert ours.keys() == theirs.keys()
        for name, value in theirs.items():
            torch.testing.assert_close(ours[name], value, rtol=1e-4, atol=atol,
                                       msg=lambda m: f"{what} {step} {name}: {m}")
    vision = [n for n in theirs if n.startswith("vision_model.")]
    assert vision and all(ref["grads"][1][n].abs().sum() > 0 for n in vision
                          if ref["grads"][1][n] is not None)


@pytest.mark.processes
@pytest.mark.parametrize("world,layout", [
    (2, ["--tensor-model-parallel-size", "2"]),
    # [LLM embedding, ViT patch embedding, ViT layer 0] [ViT layer 1, merger, LLM layers]:
    # the packed patches of a micro-batch travel between the stages
    (2, ["--pipeline-model-parallel-size", "2", "--pipeline-partition", "3,5"]),
    # the ViT as its own pipeline [ViT 0 | ViT 1], run in the LLM's bubbles by the schedule
    # executor: each piece binds its windows from the micro-batch's host media
    (2, ["--pipeline-model-parallel-size", "2", "--encoder-schedule", "bubble"]),
    # the same pieces, all forwards first and all backwards last (coarse schedule)
    (2, ["--pipeline-model-parallel-size", "2", "--encoder-schedule", "coarse"]),
    # each CP rank takes its tokens' 3-D positions; the media merge into the whole text
    (2, ["--context-parallel-size", "2", "--context-parallel-block", "8"]),
    # each CP rank encodes its share of the items (balanced on their patches), the
    # features gathered into the whole text (--vision-dp-when-cp)
    (2, ["--context-parallel-size", "2", "--context-parallel-block", "8",
         "--vision-dp-when-cp"]),
    # full recompute: the whole tower's block, and an encoder piece's layers (their
    # masks and rotary angles go into the checkpointed function)
    (1, RECOMPUTE),
    (2, ["--pipeline-model-parallel-size", "2", "--encoder-schedule", "bubble", *RECOMPUTE]),
    # the tower at TP 1 inside TP 2: two encoder replicas, each for half the micro-batches
    (4, ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
         "--encoder-schedule", "bubble", "--encoder-tensor-model-parallel-size", "1"]),
    # sequence parallelism in the tower: the packed patches padded with whole merge units
    # to a multiple of TP, split; the merger on each rank's shard; also across a ViT cut
    (2, ["--tensor-model-parallel-size", "2", "--sequence-parallel",
         "--transformer-impl", "local"]),
    (4, ["--tensor-model-parallel-size", "2", "--sequence-parallel",
         "--transformer-impl", "local", "--pipeline-model-parallel-size", "2",
         "--pipeline-partition", "3,5"]),
    # the tower on an encoder rank of its own (rank 0), the LLM at TP 2 with sequence
    # parallelism on ranks 1-2: each LLM rank pads the tower's output it receives whole
    # with merge units and takes its shard, as the tower's layers would run it
    (3, ["--tensor-model-parallel-size", "2", "--sequence-parallel",
         "--transformer-impl", "local", "--encoder-schedule", "separate"]),
], ids=["tp2", "pp2-split-vit", "pp2-bubble", "pp2-coarse", "cp2", "cp2-vision-dp", "recompute",
        "pp2-bubble-recompute",
        "tp2-pp2-bubble-etp1", "tp2-sp", "tp2-sp-pp2-split-vit", "separate-tp2-sp"])
def test_parallel_layouts_equal_one_process(qwen_vl_dir, reference, world, layout, request):
    common, ref = reference
    host_syncs = request.node.callspec.id in HOST_SYNC_FREE
    split = "--vision-dp-when-cp" in layout
    ranks = run_distributed(train, world, _argv(qwen_vl_dir, *common, *layout), (1, STEPS),
                            count_vit_calls_and_host_syncs if host_syncs
                            else count_vit_calls_and_rows if split else count_vit_layer_calls)
    if host_syncs:
        _assert_no_host_syncs(ranks)
    if split:
        _assert_items_split(ranks)
    # TP / CP ranks hold the same (gathered) tensors; pipeline stages their own pieces
    stages = (ranks[:2] if "separate" in layout  # the encoder rank, the LLM's first
              else ranks[::world // 2] if "--pipeline-model-parallel-size" in layout
              else ranks[:1])
    _assert_equal_runs(stages, ref)
    # encoder replicas (encoder TP 1) split the micro-batches: count over all of them
    replicas = "--encoder-tensor-model-parallel-size" in layout
    calls = [out["observed"]["vit_calls"] for out in (ranks if replicas else stages)]
    once = 2 * STEPS * sum(c["layers"] for c in calls) // (2 if replicas else 1)
    if RECOMPUTE[1] in layout:  # a recomputed ViT layer runs its forward twice
        assert sum(c["fwd"] for c in calls) > once, calls
    elif split:  # rank 0 gets the heaviest item of every micro-batch
        assert sum(c["fwd"] for c in calls) == once, calls
    else:
        assert sum(c["fwd"] for c in calls) == once, calls


def count_vit_calls_and_rows(chunks, optimizer, holder):
    count_vit_layer_calls(chunks, optimizer, holder)
    count_encoded_rows(chunks, optimizer, holder)


def _assert_items_split(ranks, merge_unit=4):
    """The CP ranks (``count_encoded_rows``) embed disjoint shares of every micro-batch's
    patches, together all of them (merge_unit patches per LLM token)."""
    first, second = (out["observed"]["encoded"] for out in ranks[:2])
    assert len(first) == len(second) == 2 * STEPS
    for (a, tokens), (b, same) in zip(first, second):
        assert tokens == same and a + b == merge_unit * tokens and a and b, (first, second)


def count_encoder_batches(chunks, optimizer, holder):
    """Count the executor's prepared encoder batches and their binds on this rank."""
    from megatron.core.utils import get_attr_wrapped_model

    model = get_attr_wrapped_model(chunks[0], "prepare_encoder_media").__self__
    counts = holder["encoder_batches"] = {"prepared": 0, "bound": 0}

    def counted(key, fn):
        def wrapped(*args):
            counts[key] += 1
            return fn(*args)
        return wrapped
    model.prepare_encoder_media = counted("prepared", model.prepare_encoder_media)
    model.bind_encoder_batch = counted("bound", model.bind_encoder_batch)


@pytest.mark.processes
def test_encoder_pieces_share_one_prepared_batch(qwen_vl_dir, reference):
    """Both ViT layers as two pieces on the first stage (bubble schedule): each micro-batch's
    windows, masks and rotary positions are prepared once and bound to both pieces, and
    the run equals one process."""
    common, ref = reference
    ranks = run_distributed(train, 2, _argv(
        qwen_vl_dir, *common, "--pipeline-model-parallel-size", "2", "--encoder-schedule",
        "bubble", "--encoder-pipeline-model-parallel-size", "1", "--encoder-pieces", "2"),
        (1, STEPS), count_encoder_batches)
    _assert_equal_runs(ranks, ref)
    microbatches = STEPS * 2  # global batch 4 / micro-batch 2, one DP rank
    assert ranks[0]["observed"]["encoder_batches"] == {"prepared": microbatches,
                                                       "bound": 2 * microbatches}
    assert ranks[1]["observed"]["encoder_batches"] == {"prepared": 0, "bound": 0}


@pytest.mark.processes
def test_frozen_vit_interleaved_pipeline_equals_one_process(qwen_vl_dir, tmp_path):
    """A frozen tower split over two virtual chunks of PP=2 x VPP=2: [LLM embedding, ViT
    embed, ViT 0] [ViT 1, merger] [LLM 0-2] [LLM 3, output]; it runs no backward."""
    model = ["--num-layers", "4", "--freeze-ViT"]
    init = str(tmp_path / "init")
    run_distributed(train, 1, _argv(qwen_vl_dir, *model, "--train-iters", "0", "--save", init))
    common = [*model, "--train-iters", str(STEPS), "--load", init, "--no-load-optim"]
    ref = run_distributed(train, 1, _argv(qwen_vl_dir, *common), (1, STEPS))[0]
    ranks = run_distributed(train, 2, _argv(
        qwen_vl_dir, *common, "--pipeline-model-parallel-size", "2",
        "--virtual-pipeline-model-parallel-size", "2", "--pipeline-partition", "3,2,3,2"),
        (1, STEPS), count_vit_layer_calls)
    for it in range(1, STEPS + 1):
        assert ranks[-1]["losses"][it] == pytest.approx(ref["losses"][it], rel=1e-5), it
    params = _merge(ranks, "params")
    for name, value in ref["params"].items():
        torch.testing.assert_close(params[name], value, rtol=1e-4, atol=1e-5, msg=name)
        if name.startswith("vision_model."):  # frozen: no gradient, unchanged
            assert ref["grads"][1][name] is None, name
    calls = [out["observed"]["vit_calls"] for out in ranks]
    assert [c["layers"] for c in calls] == [1, 1]
    assert all(c["fwd"] == 2 * STEPS and c["bwd"] == 0 for c in calls), calls
    # CP=2, each rank encoding its share of the items: the same run, no backward either
    ranks = run_distributed(train, 2, _argv(
        qwen_vl_dir, *common, "--context-parallel-size", "2", "--context-parallel-block", "8",
        "--vision-dp-when-cp"), (1, STEPS), count_vit_calls_and_rows)
    _assert_items_split(ranks)
    for it in range(1, STEPS + 1):
        assert ranks[0]["losses"][it] == pytest.approx(ref["losses"][it], rel=1e-5), it
        for name, value in ref["grads"][it].items():
            if value is None:
                assert ranks[0]["grads"][it][name] is None, name
            else:
                torch.testing.assert_close(ranks[0]["grads"][it][name], value, rtol=1e-4,
                                           atol=1e-6, msg=name)
    assert all(out["observed"]["vit_calls"]["bwd"] == 0 for out in ranks)


@pytest.mark.processes
def test_balanced_packing_pp2_equals_one_process(qwen_vl_dir, reference):
    """--data-balance packs samples (their images and videos together) into one sequence
    per micro-batch, balanced on patches and tokens; PP=2 with the ViT cut runs the same
    plan as one process and gives the same losses and parameters."""
    common, _ = reference
    balance = ["--data-balance", "isf", "--seq-length", "128"]
    ref = run_distributed(train, 1, _argv(qwen_vl_dir, *common, *balance), (1, STEPS))[0]
    ranks = run_distributed(train, 2, _argv(qwen_vl_dir, *common, *balance,
                                            "--pipeline-model-parallel-size", "2",
                                            "--pipeline-partition", "3,5"), (1, STEPS))
    _assert_equal_runs(ranks, ref)


def test_balancer_counts_patches(qwen_vl_dir):
    """The data balancer's vision work of a record is its items' patches (t * h * w)."""
    from megatron_mm.data.dataset import MultimodalDataset
    from megatron_mm.data.tokenizer import build_tokenizer
    from megatron_mm.training.cli.arguments import build_parser
    from megatron_mm.training.assembly.balanced_data import sample_loads
    from megatron_mm.training.assembly.data_setup import media_processors
    from megatron_mm.training.config.model_config import build_model_config
    from megatron_mm.training.config.run_config import RunConfig, group_of_flags

    args = build_parser().parse_args(_argv(qwen_vl_dir))
    args.model_config = build_model_config(group_of_flags("model", args))
    procs = media_processors(RunConfig.from_flags(args))
    data = MultimodalDataset(f"{qwen_vl_dir}/train.jsonl", build_tokenizer(),
                             {m: p.token_count for m, p in procs.items()}, None,
                             processors=procs)
    loads = sample_loads(data)
    for i in range(3):  # one image; two images; an image and a video
        media = data.encode(i).media
        patches = sum(int(g.prod(-1).sum()) for k, g in media.items() if k.endswith("_thw"))
        assert loads[i].vision == patches
    assert len({load.vision for load in loads}) > 2  # the records differ in work


@pytest.mark.processes
def test_no_host_syncs_inside_the_model(reference):
    """One process reads no device value in the model; the layouts in ``HOST_SYNC_FREE``
    check the same on either side of a cut inside the ViT, in the encoder pieces and with
    the sequence-parallel padding (test_parallel_layouts_equal_one_process)."""
    _assert_no_host_syncs([reference[1]])


@pytest.mark.processes
def test_data_balance_dp2_equals_one_process(qwen_vl_dir, reference):
    """--data-balance packs samples (images and videos) balanced on patches and tokens; DP=2
    on the packed plan equals one process on both ranks' packed micro-batches."""
    common, _ = reference
    assert_dp2_equals_both_ranks_plans(
        _argv(qwen_vl_dir, *common, "--seq-length", "128", "--data-balance", "isf-sorted"),
        STEPS)
