"""The InternVL family (InternViT, pixel shuffle, LayerNorm/MLP projector, dynamic tiling)
in the training script: TP=2, PP=2 with the cut inside the ViT, CP=2, DP=2 and the ViT as
its own pipeline in the LLM's bubbles each equal the one-process run from the same initial
checkpoint (losses, gradients, parameters), on micro-batches of different tile counts,
each image between <img> and </img> (--image-tag-type internvl, added to the demo's
SentencePiece vocabulary); --data-balance (vision work in tiles) at DP=2 equals one process on both
ranks' packed micro-batches."""

import pytest
import torch
from balanced_runs import assert_dp2_equals_both_ranks_plans
from dist_harness import run_distributed
from internvl_data import INTERNVL_MODEL
from train_workers import TINY_MODEL, train

pytestmark = pytest.mark.processes

STEPS = 2
# chain: llm embed, vision embed, 2 vision layers, projector, 2 LLM layers, output (8);
# 3,5 cuts between the ViT layers, so its hidden state travels with the text embeddings.
PP2_SPLIT_VIT = ["--pipeline-model-parallel-size", "2", "--pipeline-partition", "3,5"]


# --image-tag-type internvl on the Mistral v1 vocabulary: after 32000 + 3 media tokens
IMG_START, IMG_END = 32003, 32004


def watch_vit(chunks, optimizer, holder):
    """The ViT layers each rank holds, the tiles its micro-batches carried and the image
    tags in their tokens."""
    tags = holder["tags"] = []
    for chunk in chunks:
        def count_tags(module, args, kwargs):
            tokens = args[0] if args else kwargs["tokens"]
            tags.append(((tokens == IMG_START).sum().item(), (tokens == IMG_END).sum().item()))
        chunk.register_forward_pre_hook(count_tags, with_kwargs=True)
    holder["vit_layers"] = sum(len(c.vision_model.decoder.layers) for c in chunks
                               if getattr(c, "vision_model", None) is not None
                               and c.vision_model.decoder is not None)
    tiles = holder["tiles"] = []
    for chunk in chunks:
        module = getattr(chunk, "vision_model", None)
        if module is not None and module.has_embed:

            def embed_hook(fn):
                def wrapped(images):
                    tiles.append(images.shape[0])
                    return fn(images)
                return wrapped
            module.embed = embed_hook(module.embed)


@pytest.fixture(scope="module")
def reference(internvl_digits_dir, tmp_path_factory):
    init = tmp_path_factory.mktemp("internvl_init")
    common = TINY_MODEL + INTERNVL_MODEL + ["--data-path", internvl_digits_dir,
                                            "--micro-batch-size", "2",
                                            "--global-batch-size", "4",
                                            "--context-parallel-block", "8",
                                            "--image-tag-type", "internvl"]
    run_distributed(train, 1, common + ["--train-iters", "0", "--save", str(init)])
    argv = common + ["--train-iters", str(STEPS), "--load", str(init), "--no-load-optim"]
    return argv, run_distributed(train, 1, argv, (1, STEPS), watch_vit)[0]


def _merge(ranks, key, step=None):
    merged = {}
    for out in ranks:
        merged.update(out[key] if step is None else out[key][step])
    return merged


@pytest.mark.parametrize("layout", [
    ["--tensor-model-parallel-size", "2"],
    PP2_SPLIT_VIT,
    ["--context-parallel-size", "2"],
    [],  # DP=2: each rank one micro-batch of the global batch
    ["--pipeline-model-parallel-size", "2", "--encoder-schedule", "bubble"],
], ids=["tp2", "pp2-split-vit", "cp2", "dp2", "pp2-bubble"])
def test_internvl_parallel_equals_one_process(reference, layout):
    argv, ref = reference
    assert len(set(ref["observed"]["tiles"])) > 1, ref["observed"]["tiles"]  # varying tiles
    tags = ref["observed"]["tags"]  # each micro-batch's images wrapped, one pair each
    assert all(start == end > 0 for start, end in tags), tags
    scale = ref["params"]["vision_model.decoder.layers.0.ls1"]  # --vision-layerscale-init
    assert (scale - 0.1).abs().max() <= STEPS * 1e-3 + 1e-6  # 0.1 moved by Adam's lr a step
    ranks = run_distributed(train, 2, argv + layout, (1, STEPS), watch_vit)
    pp = "--pipeline-model-parallel-size" in layout
    dp = not layout
    stages = ranks if pp else ranks[:1]
    for it in range(1, STEPS + 1):
        assert ranks[-1]["losses"][it] == pytest.approx(ref["losses"][it], rel=1e-5), it
    if pp:
        assert [out["observed"]["vit_layers"] for out in ranks] == [1, 1]
    if dp:  # the replicas' tiles together are the reference's
        assert sorted(ranks[0]["observed"]["tiles"] + ranks[1]["observed"]["tiles"]) == \
            sorted(ref["observed"]["tiles"])
    for what, step, atol in (("grads", 1, 1e-6), ("grads", STEPS, 1e-6),
                             ("params", None, 1e-5)):
        if dp and what == "grads":
            continue  # each replica's gradient is of its own micro-batch until reduced
        ours = _merge(stages, what, step)
        theirs = ref[what] if step is None else ref[what][step]
        assert ours.keys() == theirs.keys()
        assert any(n.startswith("vision_model.decoder") for n in theirs)
        for name, value in theirs.items():
            if step != 1:  # after an Adam step fp32 noise on near-zero gradients
                # moves single weights by +-lr: compare each tensor as a whole
                error = (ours[name] - value).norm() / value.norm().clamp(min=1e-12)
                assert error < 1e-3, (name, error.item())
                continue
            torch.testing.assert_close(ours[name], value, rtol=1e-4, atol=atol,
                                       msg=lambda m: f"{what} {step} {name}: {m}")


BALANCE = ["--data-balance", "isf-sorted", "--data-balance-bounds", "12,64",
           "--transformer-impl", "local"]


def test_data_balance_dp2_equals_one_process(reference):
    """--data-balance packs samples by tiles and tokens; DP=2 on the packed plan equals one
    process on both ranks' packed micro-batches."""
    assert_dp2_equals_both_ranks_plans(reference[0] + BALANCE, STEPS)
