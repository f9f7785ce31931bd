"""FP8 (emulated, delayed scaling) on the ViT and its projector under a BF16 LLM, with the
ViT's pieces in the LLM's bubbles (``--encoder-schedule bubble``, PP=2) and DP=2, where in
each step one DP rank's micro-batches are text only: Transformer Engine reduces amaxes at
every outermost FP8 autocast exit and after the first FP8 module's backward, so the FP8
modules run (on zeros) on micro-batches without media too. Every group's ranks issue the
same collectives, the run equals one process, each FP8 weight is re-cast once a step
(``set_is_first_microbatch`` reaches the FP8 modules through DDP under a BF16 LLM), and a
frozen FP8 ViT (no gradients) still updates its scales.

Equal to one process because each step has media on one DP rank only: the max over the
DP ranks' amaxes is then the one process's amax (a text-only micro-batch adds zeros,
which change no scale), in the same order."""

import json
import os

import pytest
import torch
from dist_harness import mismatched_collectives, run_distributed
from equivalence import merge_stages
from train_workers import TINY_MODEL, train, train_logging_collectives

pytestmark = pytest.mark.processes

STEPS = 2
SEED = 1234
FP8 = ["--fp8-format", "hybrid", "--fp8-emulation", "--fp8-modules", "vision,vision-projector",
       "--fp8-amax-history-len", "2", "--fp8-amax-compute-algo", "max"]
# micro-batch size 1, 2 per DP rank and step; DP rank r takes positions 2k + r
COMMON = TINY_MODEL + FP8 + ["--vision-model-type", "siglip",  # no class token: 16 tokens
                             "--micro-batch-size", "1", "--global-batch-size", "4",
                             "--seed", str(SEED)]
BUBBLE = ["--pipeline-model-parallel-size", "2", "--encoder-schedule", "bubble"]


@pytest.fixture(scope="module")
def one_rank_text_only(digits_dir, tmp_path_factory):
    """Eight digits records placed so that in the sampler's order, step 1 gives DP rank 1
    only text and step 2 DP rank 0 only text (the other rank one image per sample)."""
    from megatron_mm.data.dataset import MegatronPretrainingSampler

    order = MegatronPretrainingSampler(8, 0, 1, 0, 1, shuffle=True, seed=SEED,
                                       global_batch_size=4).epoch_order(0)
    with open(os.path.join(digits_dir, "train.jsonl")) as f:
        records = [json.loads(line) for _, line in zip(range(8), f)]
    for position, index in enumerate(order):
        dp_rank, step = position % 2, position // 4
        if dp_rank != step:  # text only: rank 1 in step 1, rank 0 in step 2
            r = records[index]
            records[index] = {"id": r["id"],
                              "text": f"the digit {r['conversations'][1]['value']}"}
    out = tmp_path_factory.mktemp("one_rank_text_only")
    for name in ("train.jsonl", "valid.jsonl"):
        with open(out / name, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    return str(out)


@pytest.fixture(scope="module")
def init_checkpoint(one_rank_text_only, tmp_path_factory):
    """One initial checkpoint (pipeline stages draw their own init streams; freezing
    changes no weight), for every variant."""
    init = tmp_path_factory.mktemp("fp8_init")
    run_distributed(train, 1, COMMON + ["--data-path", one_rank_text_only,
                                        "--train-iters", "0", "--save", str(init)])
    return str(init)


def watch_fp8(model, optimizer, holder):
    """Each emulated FP8 linear's weight casts so far (TE's FP8 weight cache refreshes)
    and its input's scale, at its last forward."""
    from megatron_mm.models.fp8_emulation import delayed_meta, emulated_linears

    casts, scales = holder["fp8_weight_casts"], holder["fp8_input_scales"] = {}, {}

    def hook(mod, args, out, name):
        casts[name] = mod.fp8_emulation.weight_casts
        scales[name] = delayed_meta(mod).scale[0].item()

    for chunk in model:
        for linear in emulated_linears(chunk):
            name = next(n for n, m in chunk.named_modules() if m is linear)
            linear.register_forward_hook(lambda *a, name=name: hook(*a, name))


@pytest.mark.parametrize("model", [[], ["--freeze-ViT"]], ids=["trained", "frozen-vit"])
def test_text_only_dp_rank_same_collectives_and_equals_one_process(one_rank_text_only,
                                                                      init_checkpoint, model):
    argv = COMMON + model + ["--data-path", one_rank_text_only, "--train-iters", str(STEPS),
                             "--load", init_checkpoint, "--no-load-optim"]
    ref = run_distributed(train, 1, argv, (1, STEPS), watch_fp8)[0]
    ranks = run_distributed(train_logging_collectives, 4, argv + BUBBLE, (1, STEPS),
                            watch_fp8)

    logs = [out["collectives"] for out in ranks]
    assert mismatched_collectives(logs) == []
    # not vacuous: the amax all-reduces are there, on the data-parallel groups
    dp_groups = {ranks_ for log in logs for ranks_ in log if len(ranks_) == 2}
    assert any(call[0] == "all_reduce" for g in dp_groups for log in logs
               for call in log.get(g, ()))

    # one weight cast a step, on every rank holding an FP8 linear and in the reference;
    # every input scale updated from the first step on (a frozen ViT's too)
    for out in ranks + [ref]:
        casts = out["observed"]["fp8_weight_casts"]
        assert casts and set(casts.values()) == {STEPS}, casts
        scales = out["observed"]["fp8_input_scales"]
        assert 1.0 not in scales.values(), scales

    stages = [ranks[0], ranks[2]]  # DP rank 0 of pipeline stages 0 and 1
    for it in range(1, STEPS + 1):
        assert ranks[2]["losses"][it] == pytest.approx(ref["losses"][it], rel=1e-5), it
    for step in (1, STEPS):
        ours = merge_stages(stages, "grads", step)
        assert ours.keys() == ref["grads"][step].keys()
        for name, g in ref["grads"][step].items():
            if g is not None:
                torch.testing.assert_close(ours[name], g, rtol=1e-4, atol=1e-6,
                                           msg=lambda m: f"grad {name} at step {step}: {m}")
