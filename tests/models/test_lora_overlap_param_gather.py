"""LoRA at DP=2 with the distributed optimizer, ``--overlap-grad-reduce
--overlap-param-gather`` and ``--ddp-bucket-size 10000`` (buckets holding nothing but LLM
adapters): through Megatron-LM's own ``pretrain`` (``examples/megatron_lm/pretrain_vlm.py``)
and through ``examples/pretrain_mllm.py``, the adapters (and the trainable ViT with its class
token, and the projector) every forward computes with are equal on both DP ranks, and the
losses and parameters equal Megatron-LM's run without the overlap. Before the adapters were
read inside their own modules' calls, Megatron-Core DDP's forward pre-hook never waited for
their buckets: the run stopped at iteration 3 (``assert self.param_gather_handle is None``).
One launch of two ranks for the three runs."""

import pytest
import torch
from balanced_runs import small_digits
from dist_harness import run_distributed
from lora_runs import run_recorded
from megatron_lm_runs import TINY, megatron_lm_flags

from megatron_mm.training.cli.arguments import parse_args

ITERS = 3
# four LLM layers: their adapters fill buckets of their own; the ViT trains, class token too
MODEL = [f for f in TINY if f != "--disable-vision-class-token"] + ["--num-layers", "4"]
LORA = ["--lora-rank", "4", "--lora-alpha", "8", "--lora-target-modules", "all-linear"]
DISTOPT = ["--use-distributed-optimizer", "--ddp-bucket-size", "10000"]
OVERLAP = ["--overlap-grad-reduce", "--overlap-param-gather"]


@pytest.mark.processes
@pytest.mark.slow
def test_lora_trains_the_same_with_overlapped_param_gather(digits_dir, tmp_path):
    data = ["--data-path", small_digits(digits_dir, str(tmp_path / "digits"), n=64)]
    init = str(tmp_path / "init")  # one initial state (TP=2 builds draw other streams)
    common = [*data, "--train-iters", str(ITERS), *LORA, *DISTOPT, "--load", init,
              "--no-load-optim", "--no-load-rng"]
    runs = {"init": ("ours", MODEL + [*data, *LORA, "--train-iters", "0", "--save", init]),
            "megatron_lm/overlap": ("megatron_lm", megatron_lm_flags(*common, *OVERLAP,
                                                                     model=MODEL)),
            "megatron_lm": ("megatron_lm", megatron_lm_flags(*common, model=MODEL)),
            "ours/overlap": ("ours", MODEL + common + OVERLAP),
            # TP=2 without SP: the column-parallel adapters' gradients summed over TP in the
            # base's input-gradient all-reduce (models/lora.py: _SumGradsOverTP)
            "ours/tp2": ("ours", MODEL + common + ["--tensor-model-parallel-size", "2"])}
    ranks = run_distributed(run_recorded, 2, list(runs.values()))
    got = {name: [rank[i] for rank in ranks] for i, name in enumerate(runs)}
    want = got["megatron_lm"][0]
    for name in ("megatron_lm/overlap", "ours/overlap"):
        first, second = got[name]
        assert len(first["trained"]) == ITERS  # one micro-batch per rank and step
        for step, (a, b) in enumerate(zip(first["trained"], second["trained"])):
            assert a.equal(b), f"{name}: DP ranks computed with other weights at step {step}"
        for it in range(1, ITERS + 1):
            assert first["losses"][it] == pytest.approx(want["losses"][it], rel=1e-6), (name, it)
        for a, b in zip(first["trained"], want["trained"]):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    tp2 = got["ours/tp2"][0]
    for key in ("losses", "grad_norms"):
        for it in range(1, ITERS + 1):
            assert tp2[key][it] == pytest.approx(want[key][it], rel=1e-5), (key, it)


def test_overlap_param_gather_needs_the_distributed_optimizer(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--overlap-param-gather", "--overlap-grad-reduce"], world_size=1)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--overlap-param-gather needs --use-distributed-optimizer" in err
    assert err.count("\n") == 1
