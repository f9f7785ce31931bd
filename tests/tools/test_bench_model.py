"""Smoke test of tools/bench_model.py: tiny sizes, 2 timed steps, one process.

Run as ``python tools/bench_model.py`` on a forked rank (``tool_runs``): the benchmark sets
up its own process group and Megatron-Core parallel state, which must not leak into the
pytest process.
"""

from pathlib import Path

import pytest
from tool_runs import run_tool

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
TINY = ("--steps 2 --warmup 1 --micro-batch-size 2 --seq-length 24 "
        "--vision-num-layers 1 --vision-hidden-size 32 --vision-num-attention-heads 2 "
        "--img-size 28 --patch-dim 14 --num-layers 2 --hidden-size 64 "
        "--num-attention-heads 4 --num-query-groups 2 --ffn-hidden-size 128 "
        "--vocab-size 1000").split()


def test_bench_model_tiny_single_process():
    proc = run_tool(ROOT / "tools" / "bench_model.py", *TINY, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in proc.stdout.splitlines() if line.startswith("| ")}
    ours, llava = rows["megatron_mm MultimodalModel"], rows["megatron.core LLaVAModel"]
    ratio = rows["ratio (ours / LLaVA)"]
    assert len(ours) == len(llava) == len(ratio) == 7
    # Same sizes -> same parameter count; LLaVA starts from our weights and sees the same
    # tokens -> the same loss after the same steps.
    assert ours[0] == llava[0] and float(ratio[0]) == 1.0
    assert abs(float(ours[-1]) - float(llava[-1])) < 1e-4
    for row in (ours, llava):  # times and exact static memory > 0; an RSS growth >= 0
        assert min(float(v) for v in row[1:4]) > 0 and float(row[4]) >= 0
