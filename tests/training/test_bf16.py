"""bf16 (``--bf16``: bf16 parameters and activations, fp32 main gradients and Adam masters)
runs of TP=2, PP=2 and the bubble encoder schedule equal the one-process bf16 run within
bf16 tolerance: the same losses, and every gradient and parameter close to the reference
in relative norm. One shared reference from one saved initialisation keeps this cheap."""

import pytest
import torch
from dist_harness import run_distributed
from train_workers import TINY_MODEL, train

pytestmark = pytest.mark.processes

STEPS = 2
# bf16 keeps 8 significant bits (relative rounding 2^-9 = 0.2%); TP and PP change the
# order of the reductions and where activations are rounded, which moves results by a few
# roundings, not by the O(1) of a wrong gradient (a missing or doubled reduction). Measured
# worst cases (printed with -s): TP=2 grads 0.020 (the first ViT layer's pre-MLP norm weight,
# the smallest gradients, furthest down the backward), params 0.0034; PP=2 and the bubble
# schedule 1e-7 and 3e-5.
LOSS_RTOL = 1e-2
GRAD_RTOL = 5e-2  # ||g - g_ref|| / ||g_ref||, per tensor
# Adam's first updates are about lr x sign(g): where a gradient element is near zero, bf16
# noise may flip its sign and move that weight by 2 lr (lr 1e-3) the other way.
PARAM_ATOL = 2 * 1e-3 * STEPS + 1e-3


@pytest.fixture(scope="module")
def bf16_reference(digits_dir, tmp_path_factory):
    init = tmp_path_factory.mktemp("bf16-init")
    common = TINY_MODEL + ["--data-path", digits_dir, "--micro-batch-size", "2",
                           "--global-batch-size", "4", "--bf16"]
    run_distributed(train, 1, common + ["--train-iters", "0", "--save", str(init)])
    argv = common + ["--train-iters", str(STEPS), "--load", str(init), "--no-load-optim"]
    return argv, run_distributed(train, 1, argv, (1, STEPS))[0]


def _merge(stages, key, step=None):
    merged = {}
    for out in stages:
        merged.update(out[key] if step is None else out[key][step])
    return merged


def relative_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours - ref).norm() / ref.norm().clamp(min=1e-12))


PP2 = ["--pipeline-model-parallel-size", "2"]


@pytest.mark.parametrize("layout, pp", [
    (["--tensor-model-parallel-size", "2"], 1),
    (PP2, 2),
    (PP2 + ["--encoder-schedule", "bubble"], 2),
], ids=["tp2", "pp2", "pp2-bubble"])
def test_bf16_parallel_equals_one_process(bf16_reference, layout, pp):
    argv, ref = bf16_reference
    ranks = run_distributed(train, 2, argv + layout, (1, STEPS))
    stages = ranks[:: 2 // pp]  # TP rank 0 of each stage (TP-gathered tensors)
    for it in range(1, STEPS + 1):
        assert stages[-1]["losses"][it] == pytest.approx(ref["losses"][it], rel=LOSS_RTOL)
    worst = {}
    for what, step in (("grads", 1), ("grads", STEPS), ("params", None)):
        ours, theirs = _merge(stages, what, step), ref[what] if step is None \
            else ref[what][step]
        assert ours.keys() == theirs.keys()
        for name, value in theirs.items():
            if value is None or not value.norm():
                continue
            if what == "grads":
                err = relative_error(ours[name], value)
                assert err < GRAD_RTOL, (step, name, err)
            else:
                err = float((ours[name] - value).abs().max())
                assert err < PARAM_ATOL, (name, err)
            worst[what] = max(worst.get(what, (0.0, "")), (err, name))
    print(f"bf16 {layout}: worst relative error {worst}")
