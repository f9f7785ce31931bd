"""PP=2 (also interleaved, VPP=2) and TP=2 x PP=2 (encoder and projector on the first
stage, LLM layers split) equal one process from the same initial checkpoint: losses,
gradients and parameters."""

import pytest
import torch
from dist_harness import run_distributed
from train_workers import TINY_MODEL, train

STEPS = 3


def _merge(ranks, key, step=None):
    """One name -> tensor dict from the pipeline stages' pieces."""
    merged = {}
    for out in ranks:
        part = out[key] if step is None else out[key][step]
        assert not set(part) & set(merged), "a parameter lives on two stages"
        merged.update(part)
    return merged


_REFERENCES = {}


def _reference(digits_dir, tmp_path_factory, model):
    """Initial checkpoint + one-process run for a model variant, shared by the layouts."""
    key = tuple(model)
    if key not in _REFERENCES:
        init = tmp_path_factory.mktemp("init")
        common = TINY_MODEL + ["--data-path", digits_dir, "--micro-batch-size", "2",
                               "--global-batch-size", "8", *model]
        run_distributed(train, 1, common + ["--train-iters", "0", "--save", str(init)])
        argv = common + ["--train-iters", str(STEPS), "--load", str(init), "--no-load-optim"]
        _REFERENCES[key] = argv, run_distributed(train, 1, argv, (1, STEPS))[0]
    return _REFERENCES[key]


PP2 = ["--pipeline-model-parallel-size", "2"]


@pytest.mark.parametrize("world, layout, model", [
    (2, PP2, []),
    (2, PP2, ["--freeze-ViT"]),
    (2, PP2 + ["--virtual-pipeline-model-parallel-size", "2"], ["--num-layers", "4"]),
    (4, PP2 + ["--tensor-model-parallel-size", "2"], []),
], ids=["pp2", "pp2-frozen-vit", "pp2-vpp2", "tp2-pp2"])
def test_pipeline_parallel_equals_one_process(digits_dir, tmp_path_factory, world, layout,
                                              model):
    # Stages draw different random streams, so both runs start from one saved init.
    argv, ref = _reference(digits_dir, tmp_path_factory, model)
    ranks = run_distributed(train, world, argv + layout, (1, STEPS))
    pp2 = ranks[:: world // 2]  # TP rank 0 of each stage: full (TP-gathered) tensors
    last = pp2[1]  # the loss lives on the last stage
    for it in range(1, STEPS + 1):
        assert last["losses"][it] == pytest.approx(ref["losses"][it], rel=1e-5), it
    for what, step, atol in (("grads", 1, 1e-6), ("grads", STEPS, 1e-6), ("params", None, 1e-5)):
        ours = _merge(pp2, what, step)
        theirs = ref[what] if step is None else ref[what][step]
        assert ours.keys() == theirs.keys()
        for name, value in theirs.items():
            if value is None:
                assert ours[name] is None, name
                continue
            torch.testing.assert_close(ours[name], value, rtol=1e-4, atol=atol,
                                       msg=lambda m: f"{what} {step} {name}: {m}")
