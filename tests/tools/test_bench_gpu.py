"""Smoke test of tools/bench_gpu.py on the CPU: the local rows run (tiny sizes, 2 timed
steps), the Transformer Engine rows are skipped with the reason, and the columns agree
with each other (tokens/s and MFU from the step time, the same loss from the same weights).

Run on forked ranks (``tool_runs``, ``dist_harness``): the benchmark sets up its own process
group and Megatron-Core state.
"""

import sys
from pathlib import Path

import pytest
from dist_harness import run_distributed
from tool_runs import run_tool

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
TINY = ("--steps 2 --warmup 1 --micro-batch-size 2 --seq-length 24 "
        "--vision-num-layers 1 --vision-hidden-size 32 --vision-num-attention-heads 2 "
        "--img-size 28 --patch-dim 14 --num-layers 2 --hidden-size 64 "
        "--num-attention-heads 4 --num-query-groups 2 --ffn-hidden-size 128 "
        "--vocab-size 1000 --peak-tflops 0.001").split()


def test_bench_gpu_local_rows_on_cpu():
    proc = run_tool(ROOT / "tools" / "bench_gpu.py", *TINY, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in proc.stdout.splitlines() if line.startswith("| ")}
    flops = float(proc.stdout.split("model FLOPs per step ")[1].split(";")[0])
    for te in ("megatron_mm, TE, bf16", "megatron_mm, TE, FP8 (LLM)"):
        assert rows[te][0] == "skipped: Transformer Engine is not importable; no CUDA device"
    ours, llava = rows["megatron_mm, local, bf16"], rows["megatron.core LLaVAModel, local, bf16"]
    for step_ms, tokens_per_s, mfu, peak_mib, loss in (ours, llava):
        step = float(step_ms) / 1e3
        assert abs(float(tokens_per_s) - 2 * 24 / step) <= 1 + 1e-3 * float(tokens_per_s)
        assert abs(float(mfu.rstrip("%")) / 100 - flops / (step * 1e9)) < 1e-3 + 1e-2 * (
            flops / (step * 1e9))
        assert float(peak_mib) > 0
    assert abs(float(ours[-1]) - float(llava[-1])) < 1e-3  # same weights, same tokens


def _fp8_steps(rank, argv):
    """The FP8 row's model after 3 steps: its FP8 weight casts and FP8 settings."""
    import torch

    sys.path.insert(0, str(ROOT / "tools"))
    import bench_gpu
    import bench_model as bm

    args = bench_gpu.parse_args(argv)
    bm.init_distributed(args)
    cfg = bm.model_config(args)
    model = bench_gpu.build_rows(args, cfg, False, args.vocab_size - 1)["te-fp8"]
    (inputs, mask), _ = bm.make_batches(cfg, args.micro_batch_size, args.vocab_size - 1,
                                        args.seed, torch.device("cpu"))
    trainee = bm.wrap("fp8", model, args.bf16, False, inputs, mask)
    for _ in range(3):
        bm.train_step(trainee, False)
    linear = model.language_model.decoder.layers[0].mlp.linear_fc1
    config = model.language_model.config
    return linear.fp8_emulation.weight_casts, config.fp8, config.fp8_amax_history_len


def test_bench_gpu_fp8_row_from_the_fp8_flags_recast_each_step():
    # The FP8 row's settings are the --fp8-* flags (emulated here, on the CPU), and every
    # step re-casts the FP8 weights the optimizer changed (as a training step's first
    # micro-batch does), instead of reusing step 0's.
    argv = TINY + ("--rows te-fp8 --fp8-emulation --fp8-format e4m3 "
                   "--fp8-amax-history-len 16").split()
    assert run_distributed(_fp8_steps, 1, argv) == [(3, "e4m3", 16)]
