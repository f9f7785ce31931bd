"""Smoke test of tools/bench_hybrid.py (hybrid GDN LLM vs every layer full attention):
tiny sizes, one timed step per model at two lengths, on a forked rank (its own world)."""

from pathlib import Path

import pytest
from tool_runs import run_tool

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
TINY = ("--seq-lengths 64 128 --steps 1 --warmup 1 --num-layers 2 --hidden-size 64 "
        "--kv-channels 32 --linear-attention-freq 2 --linear-head-dim 16 "
        "--vocab-size 256").split()


def test_bench_hybrid_tiny():
    proc = run_tool(ROOT / "tools" / "bench_hybrid.py", *TINY, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "hybrid pattern [1, 0]" in proc.stdout
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in proc.stdout.splitlines()
            if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
    assert [r[0] for r in rows] == ["64", "128"]
    for row in rows:  # times > 0, RSS growths >= 0
        assert min(float(v) for v in row[1:4]) > 0 and min(float(v) for v in row[4:6]) >= 0
