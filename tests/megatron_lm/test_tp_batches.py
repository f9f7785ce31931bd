"""Micro-batches read on the first tensor-parallel rank of each stage and broadcast to the
others (``training/data_setup.py: tensor_parallel_batches``), in training: Megatron-LM's
loop (``examples/megatron_lm/pretrain_vlm.py``) at TP=2 (DP=2) and TP=2 x PP=2, and the
package's at TP=2 x PP=2 with the bubble schedule (the ViT's later piece on the stage that
is sent no pixels), each equal to the old path (every rank reads its own copy) in losses
and gradient norms from one checkpoint, and only TP rank 0 decodes. Four ranks, one
launch."""

import pytest
from balanced_runs import small_digits
from dist_harness import run_distributed
from megatron_lm_runs import megatron_lm_flags, ours_flags
from tp_batch_runs import counted_steps

pytestmark = [pytest.mark.processes, pytest.mark.slow]

TP2 = ["--tensor-model-parallel-size", "2"]
PP2 = ["--pipeline-model-parallel-size", "2"]
RUNS = {"megatron_lm/tp2": ("megatron_lm", TP2),
        "megatron_lm/tp2_pp2": ("megatron_lm", TP2 + PP2),
        "ours/tp2_pp2_bubble": ("ours", TP2 + PP2 + ["--encoder-schedule", "bubble"])}


@pytest.fixture(scope="module")
def runs(digits_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("tp_batches")
    data = ["--data-path", small_digits(digits_dir, str(root / "digits"), n=32)]
    init = str(root / "init")
    steps = [("ours", ours_flags(*data, *TP2, "--train-iters", "0", "--save", init), False)]
    names = []
    for name, (kind, layout) in RUNS.items():
        argv = [*data, "--train-iters", "2", "--load", init, "--no-load-optim",
                "--no-load-rng", *layout]
        flags = megatron_lm_flags(*argv) if kind == "megatron_lm" else ours_flags(*argv)
        for path in ("new", "old"):
            steps.append((kind, flags, path == "old"))
            names.append(f"{name}/{path}")
    ranks = run_distributed(counted_steps, 4, steps)
    return {name: [rank[i + 1] for rank in ranks] for i, name in enumerate(names)}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_equals_the_old_path(runs, name):
    new, old = runs[f"{name}/new"], runs[f"{name}/old"]
    for got, want in zip(new, old):
        for key in ("losses", "grad_norms"):
            assert list(got[key]) == list(want[key]), (key, got[key], want[key])
            for it in want[key]:
                assert got[key][it] == pytest.approx(want[key][it], rel=1e-6, abs=1e-7,
                                                      nan_ok=True)
    assert any(r["losses"] for r in new)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_only_tp_rank_0_decodes(runs, name):
    new, old = runs[f"{name}/new"], runs[f"{name}/old"]
    decoded = [r["decoded"] for r in new]
    # ranks 0, 2 are TP rank 0 (Megatron-Core's order: TP fastest)
    assert decoded[1] == decoded[3] == 0 and decoded[0] > 0 and decoded[2] > 0, decoded
    assert [r["decoded"] for r in old] == [decoded[0], decoded[0], decoded[2], decoded[2]]
