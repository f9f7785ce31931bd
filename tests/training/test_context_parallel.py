"""Context parallelism (our CP attention, workload-balanced token assignment) equals one
process from the same initial checkpoint: losses and gradients of CP=4, CP=2 x TP=2 (also
with --sequence-parallel),
CP=2 x PP=2, CP=2 x PP=2 x VPP=2 and CP=2 x PP=2 with the ViT in the LLM's bubbles
(CP=2 alone is their CP part, not run on its own), media attending
bidirectionally inside each image, on data mixing one-image, two-image (adjacent items)
and text-only samples; ranks hold unequal token counts, and batches too short to split
run replicated; with --vision-dp-when-cp (each CP rank encoding its share of the images:
CP=2, CP=2 x PP=2, a frozen ViT) too. The CP=4 run also checks the CP attention itself
against dense attention on every mask family, CP=2 and CP=4 (cp_attention_check), saving
a launch of its own; the six 4-rank layouts run in one launch, as do the reference's
checkpoint and run."""

import json
import os

import pytest
import torch
from cp_attention_check import assert_attention_errors, check_attention
from dist_harness import run_distributed
from equivalence import REFERENCE_STEPS
from gdn_cp_check import train_runs
from train_workers import TINY_MODEL, count_encoded_rows, train

pytestmark = pytest.mark.processes

STEPS = 2
# Blocks of 8 tokens: the batches (about 30-50 tokens) split into 4-7 blocks over CP ranks.
CP_FLAGS = ["--media-attention", "bidirectional", "--context-parallel-block", "8"]


@pytest.fixture(scope="module")
def mixed_dir(digits_dir, tmp_path_factory):
    """Digits records, every 4th one text only and every 8th one with two images (the
    micro-batches without one are short)."""
    out = tmp_path_factory.mktemp("mixed")
    with open(os.path.join(digits_dir, "train.jsonl")) as f:
        records = [json.loads(line) for _, line in zip(range(64), f)]
    mixed = []
    for i, r in enumerate(records):
        if i % 4 == 1:
            r = {"id": r["id"], "text": f"the digit {r['conversations'][1]['value']}"}
        elif i % 8 == 2:
            r = {"id": r["id"], "text": "<image><image> two digits",
                 "images": r["images"] + records[i - 1]["images"]}
        mixed.append(r)
    for name in ("train.jsonl", "valid.jsonl"):
        with open(out / name, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in mixed)
    return str(out)


def _watch_masks_and_check_attention(model, optimizer, holder):
    """``_watch_masks``, and first the CP attention on every mask family, CP=2 and CP=4
    (cp_attention_check) in this already running 4-rank world."""
    holder["attention"] = check_attention(torch.distributed.get_rank())
    _watch_masks(model, optimizer, holder)


def _watch_masks(model, optimizer, holder):
    """Record each micro-batch's CP split (token counts per rank, replicated or not), and
    how often the schedule executor plans a micro-batch's CP token count for its message
    shapes (``holder["local_lengths"]``: per iteration, the most for one micro-batch)."""
    from megatron_mm.models.context_parallel import ContextParallelMask
    from megatron_mm.runtime import message_specs

    lengths = holder.setdefault("local_lengths", [])
    specs_init = message_specs.MessageSpecs.__init__

    def counting_init(self, *args, **kwargs):
        specs_init(self, *args, **kwargs)
        if self.local_length is None:
            return
        calls, plan = {}, self.local_length
        lengths.append(calls)

        def counted(batch):
            calls[id(batch)] = calls.get(id(batch), 0) + 1
            return plan(batch)
        self.local_length = counted
    message_specs.MessageSpecs.__init__ = counting_init

    seen = holder.setdefault("splits", [])
    for chunk in model:
        def hook(module, args, kwargs):
            mask = kwargs.get("attention_mask")
            if isinstance(mask, ContextParallelMask):
                seen.append((tuple(mask.counts), mask.replicated))
        chunk.register_forward_pre_hook(hook, with_kwargs=True)


@pytest.fixture(scope="module")
def reference(mixed_dir, tmp_path_factory):
    """One initial checkpoint (pipeline stages draw their own init streams) and the
    one-process run from it, shared by every layout."""
    init = tmp_path_factory.mktemp("init")
    # With the final evaluation: validation loss (split like training) and greedy answers
    # (every CP rank decodes the whole prompt under the same mask) must match too.
    model = [a for a in TINY_MODEL if a != "--skip-final-eval"]
    common = model + ["--data-path", mixed_dir, "--micro-batch-size", "4",
                           "--global-batch-size", "8", *CP_FLAGS]
    argv = common + ["--train-iters", str(STEPS), "--load", str(init), "--no-load-optim"]
    initial, run = run_distributed(train_runs, 1, [
        (common + ["--train-iters", "0", "--save", str(init)], ()), (argv, (1, STEPS))])[0]
    return argv, run, initial


def _runs_with_hooks(rank, runs):
    """``train(rank, argv, grad_steps, hooks)`` for each ``(argv, grad_steps, hooks)`` in
    turn in this world (one launch for several layouts), Megatron's state and the
    MessageSpecs that ``_watch_masks`` wraps reset between."""
    from megatron.core import parallel_state
    from megatron_mm.runtime import message_specs

    out = []
    for argv, grad_steps, hooks in runs:
        specs_init = message_specs.MessageSpecs.__init__
        try:
            out.append(train(rank, argv, grad_steps, hooks))
        finally:
            message_specs.MessageSpecs.__init__ = specs_init
            parallel_state.destroy_model_parallel()
    return out


CP2 = ["--context-parallel-size", "2"]

LAYOUTS = [
    # Blocks of 12: micro-batches with a two-image sample (37 tokens) split 4 ways,
    # shorter ones (32-35 tokens: 3 blocks) run replicated on every CP rank.
    (4, ["--context-parallel-size", "4", "--context-parallel-block", "12"], True),
    (4, CP2 + ["--tensor-model-parallel-size", "2"], False),
    # each CP rank's tokens split again over the TP ranks (blocks of 8: even counts)
    (4, CP2 + ["--tensor-model-parallel-size", "2", "--sequence-parallel"], False),
    (4, CP2 + ["--pipeline-model-parallel-size", "2"], False),
    # interleaved: [embedding, ViT embed, ViT 0] [ViT 1, projector] [LLM 0-1] [output]
    (4, CP2 + ["--pipeline-model-parallel-size", "2",
               "--virtual-pipeline-model-parallel-size", "2", "--pipeline-partition",
               "3,2,2,1"], False),
    # the ViT as its own pipeline over both stages, in the LLM's bubbles (whole on each
    # CP rank, as the encoders are)
    (4, CP2 + ["--pipeline-model-parallel-size", "2", "--encoder-schedule", "bubble"], False),
]
LAYOUT_IDS = ["cp4", "cp2-tp2", "cp2-tp2-sp", "cp2-pp2", "cp2-pp2-vpp2", "cp2-pp2-bubble"]


def _hosts_attention_check(world, layout):
    return world == 4 and "4" in layout  # the CP=4 run


@pytest.fixture(scope="module")
def layout_runs(reference):
    """Every 4-rank layout in one launch, in ``LAYOUTS``' order."""
    argv = reference[0]
    return run_distributed(_runs_with_hooks, 4, [
        (argv + layout, (1, STEPS), _watch_masks_and_check_attention
         if _hosts_attention_check(world, layout) else _watch_masks)
        for world, layout, _ in LAYOUTS])


@pytest.mark.parametrize("world, layout, some_unsplit", LAYOUTS, ids=LAYOUT_IDS)
def test_context_parallel_equals_one_process(reference, layout_runs, world, layout,
                                             some_unsplit):
    argv, ref, _ = reference
    check = _hosts_attention_check(world, layout)
    i = [entry[1] for entry in LAYOUTS].index(layout)
    ranks = [rank[i] for rank in layout_runs]
    if check:
        assert_attention_errors([out["observed"]["attention"] for out in ranks])
    pp = 2 if "--pipeline-model-parallel-size" in layout else 1
    stages = ranks[:: world // pp]  # TP and CP rank 0 of each stage
    for it in range(1, STEPS + 1):
        assert stages[-1]["losses"][it] == pytest.approx(ref["losses"][it], rel=1e-5), it
    last = stages[-1]
    assert last["val_loss"] == pytest.approx(ref["val_loss"], rel=1e-5)
    assert last["val_accuracy"] == ref["val_accuracy"]
    for it in (1, STEPS):
        ours = {}
        for stage in stages:
            ours.update(stage["grads"][it])
        assert ours.keys() == ref["grads"][it].keys()
        for name, value in ref["grads"][it].items():
            torch.testing.assert_close(ours[name], value, rtol=1e-4, atol=1e-6,
                                       msg=lambda m: f"grad {it} {name}: {m}")
    if "bubble" in layout:  # the executor plans each micro-batch's CP tokens once
        counts = [c for out in ranks for c in out["observed"]["local_lengths"] if c]
        assert counts and max(max(c.values()) for c in counts) == 1, counts
    splits = [s for out in ranks for s in out["observed"]["splits"]]
    assert any(len(set(c)) > 1 for c, rep in splits if not rep), splits
    assert any(rep for _, rep in splits) == some_unsplit, splits


def _split_items_and_watch_masks(model, optimizer, holder):
    count_encoded_rows(model, optimizer, holder)
    _watch_masks(model, optimizer, holder)


@pytest.mark.parametrize("layout, frozen", [
    (CP2 + ["--vision-dp-when-cp"], False),
    # the ViT cut between its layers: [embedding, ViT embed, ViT 0] [ViT 1, projector,
    # LLM]: each CP rank's share of the hidden state travels, the features are gathered
    # on the second stage
    (CP2 + ["--vision-dp-when-cp", "--pipeline-model-parallel-size", "2",
            "--pipeline-partition", "3,5"], False),
    # a frozen ViT (the session's reference: causal, 2 samples per micro-batch)
    (CP2 + ["--vision-dp-when-cp", "--context-parallel-block", "8"], True),
], ids=["cp2", "cp2-pp2", "cp2-frozen-vit"])
def test_vision_dp_when_cp_equals_one_process(reference, one_process_reference, digits_dir,
                                              layout, frozen):
    """--vision-dp-when-cp: each CP rank encodes a share of each micro-batch's images (LPT
    on equal items), the features all-gathered and their gradients summed back over the
    CP ranks: the same losses and gradients as one process."""
    argv, ref = (one_process_reference(digits_dir, ["--freeze-ViT"]) if frozen
                 else reference[:2])
    steps = REFERENCE_STEPS if frozen else STEPS
    world = 4 if "--pipeline-model-parallel-size" in layout else 2
    ranks = run_distributed(train, world, argv + layout, (1, steps),
                            _split_items_and_watch_masks)
    stages = ranks[:: world // 2] if world == 4 else ranks[:1]
    for it in range(1, steps + 1):
        assert stages[-1]["losses"][it] == pytest.approx(ref["losses"][it], rel=1e-5), it
    for it in (1, steps):
        ours = {}
        for stage in stages:
            ours.update(stage["grads"][it])
        assert ours.keys() == ref["grads"][it].keys()
        for name, value in ref["grads"][it].items():
            if value is None:  # frozen
                assert ours[name] is None, name
                continue
            torch.testing.assert_close(ours[name], value, rtol=1e-4, atol=1e-6,
                                       msg=lambda m: f"grad {it} {name}: {m}")
    # the CP ranks of the first stage (ranks 0, 1) encode disjoint shares of every batch
    width = 16  # TINY_MODEL: 16 patch tokens per image
    first, second = (out["observed"]["encoded"] for out in ranks[:2])
    assert len(first) == len(second) > 0
    for (a, tokens), (b, same) in zip(first, second):
        assert tokens == same and a + b == tokens // width and a and b, (first, second)


def test_validation_on_flex_attention_equals_local(reference):
    """--attention-backend flex at CP=2 (forward only: on CPU torch runs no FlexAttention
    backward, so --train-iters 0): the initial checkpoint's validation loss and greedy
    answers equal the one-process run's on the local path."""
    argv, _, initial = reference
    argv = list(argv)
    argv[argv.index("--train-iters") + 1] = "0"
    ranks = run_distributed(train, 2, argv + CP2 + ["--attention-backend", "flex"], (),
                            _watch_masks)
    assert ranks[0]["val_loss"] == pytest.approx(initial["val_loss"], rel=1e-5)
    assert ranks[0]["val_accuracy"] == initial["val_accuracy"]
    splits = [s for out in ranks for s in out["observed"]["splits"]]
    assert any(not rep for _, rep in splits), splits  # some batches really split
