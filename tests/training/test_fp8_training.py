"""FP8 emulation in training: TP=2 equals TP=1. Delayed scaling reduces every amax over
the TP group, so each TP rank quantises its shard with the whole tensor's scale: the same
FP8 values as one process, up to fp32 summation order in the GEMMs."""

import pytest
import torch
from dist_harness import run_distributed
from equivalence import assert_equal_runs
from test_fp8_collectives import watch_fp8
from train_workers import TINY_MODEL, train

pytestmark = pytest.mark.processes

STEPS = 1
FP8 = ["--fp8-format", "hybrid", "--fp8-emulation", "--fp8-modules", "llm,vision-projector",
       "--fp8-amax-history-len", "4", "--fp8-amax-compute-algo", "max"]


def _argv(data, tp):
    return TINY_MODEL + FP8 + [
        "--data-path", data, "--train-iters", str(STEPS), "--micro-batch-size", "4",
        "--global-batch-size", "8", "--make-vocab-size-divisible-by", str(256 // tp),
        "--tensor-model-parallel-size", str(tp)]


def test_fp8_emulation_tensor_parallel_2_equals_1(digits_dir):
    ref = run_distributed(train, 1, _argv(digits_dir, 1), (1, STEPS))[0]
    ours = run_distributed(train, 2, _argv(digits_dir, 2), (1, STEPS))[0]
    _assert_same(ours, ref)
    sp = run_distributed(train, 2, _argv(digits_dir, 2) + ["--sequence-parallel"],
                         (1, STEPS), _projector_rows)
    # Under SP the projector runs on each rank's ViT shard (TE checks those rows): the ViT
    # pads its 17 tokens (16 patches, class token) to TP x 16 = 32, 16 rows an image a rank
    rows = {r for out in sp for r in out["observed"]["projector_rows"]}
    assert rows and all(r % 16 == 0 and r // 16 in (1, 2, 3, 4) for r in rows), rows
    _assert_same(sp[0], ref, grads=False)


def _projector_rows(model, optimizer, holder):
    rows = holder["projector_rows"] = []
    for chunk in model:
        for name, module in chunk.named_modules():
            if name.endswith("vision_projection"):
                module.register_forward_pre_hook(lambda m, args: rows.append(args[0].shape[0]))


def _assert_same(ours, ref, grads=True):
    for it in range(1, STEPS + 1):
        assert ours["losses"][it] == pytest.approx(ref["losses"][it], rel=1e-5), it
    if not grads:
        return
    for it in (1, STEPS):
        for name, g in ref["grads"][it].items():
            if g is not None:
                torch.testing.assert_close(ours["grads"][it][name], g, rtol=1e-4, atol=1e-6,
                                           msg=lambda m: f"grad {name} at step {it}: {m}")


def _init(argv, tmp_path) -> list:
    """``argv`` loading one saved initial checkpoint of its model."""
    init = str(tmp_path / "init")
    run_distributed(train, 1, argv + ["--train-iters", "0", "--save", init])
    return argv + ["--train-iters", "2", "--load", init, "--no-load-optim"]


def test_fp8_emulation_separate_placement_equals_one_process(digits_dir, tmp_path):
    """``--encoder-schedule separate``: the FP8 ViT on rank 0, its FP8 projector and the
    FP8 LLM on ranks 1-2 (PP=2): each side's modules reduce their amaxes over their own
    grid's amax group (Megatron-Core's TP x DP x CP there), at their own autocast exits,
    and equal one process, whose FP8 modules reduce and update at the same points of
    each module's own micro-batch order (delayed scaling, two steps: the scales carried
    over)."""
    argv = TINY_MODEL + FP8[:3] + ["--fp8-modules", "vision,vision-projector,llm",
                                    "--fp8-amax-history-len", "2",
                                    "--fp8-amax-compute-algo", "max",
                                    "--vision-model-type", "siglip",  # 16 tokens an image
                                    "--data-path", digits_dir, "--micro-batch-size", "2",
                                    "--global-batch-size", "4"]
    argv = _init(argv, tmp_path)
    ref = run_distributed(train, 1, argv, (1, 2), watch_fp8)[0]
    ranks = run_distributed(train, 3, argv + ["--encoder-schedule", "separate",
                                              "--pipeline-model-parallel-size", "2"], (1, 2),
                            watch_fp8)
    assert_equal_runs(ranks, ref, 2, holding="vision_model.")
    # not vacuous: FP8 linears on every rank (the ViT's on rank 0, the projector's and the
    # LLM's on the LLM's stages), each weight cast once a step, every input scale updated
    names = set()
    for out in ranks:
        casts, scales = (out["observed"][k] for k in ("fp8_weight_casts", "fp8_input_scales"))
        assert casts and set(casts.values()) == {2} and 1.0 not in scales.values(), out
        names |= set(scales)
    assert {n.split(".")[0] for n in names} >= {"vision_model", "vision_projection",
                                                 "language_model"}


def test_fp8_emulation_separate_placement_llm_dp2_equals_colocated(digits_dir, tmp_path):
    """An FP8 LLM and projector (delayed scaling) on 2 LLM replicas next to 1 encoder rank:
    their amax reductions span both replicas (Megatron-Core's TP x DP x CP group) inside
    every forward and backward, so the program keeps the replicas' actions in step
    (``SeparateSchedule.walks_with``), and the run equals the colocated one at DP=2 (the
    same reductions over the same pairs of micro-batches; one process, reducing each
    micro-batch alone, is not the reference here)."""
    argv = _init(TINY_MODEL + FP8 + ["--data-path", digits_dir, "--micro-batch-size", "2",
                                     "--global-batch-size", "8"], tmp_path)
    colocated = run_distributed(train, 2, argv, (1, 2))[0]
    ranks = run_distributed(train, 3, argv + ["--encoder-schedule", "separate"], (1, 2))
    assert_equal_runs(ranks[:2], colocated, 2, holding="vision_model.")
