"""tools/bench_recompute.py at tiny sizes (one process, about 15 s): four rows, the same
loss for each, and the adaptive choice within the budget it was given (run as the command
line runs it, on a forked rank: ``tool_runs``)."""

from pathlib import Path

import pytest
from tool_runs import run_tool

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "bench_recompute.py"


def test_bench_recompute_tiny():
    proc = run_tool(
        TOOL, "--num-layers", "2", "--hidden-size", "64",
         "--num-attention-heads", "4", "--seq-length", "64", "--vision-hidden-size", "32",
         "--vision-num-layers", "2", "--vision-num-attention-heads", "2", "--img-h", "16",
         "--img-w", "16", "--patch-dim", "8", "--disable-vision-class-token",
         "--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "1e-4",
         "--bench-iters", "1", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in proc.stdout.splitlines() if line.startswith("| ")
            and line.split("|")[1].strip() in ("none", "full", "same N", "adaptive")}
    assert set(rows) == {"none", "full", "same N", "adaptive"}, proc.stdout
    assert rows["full"][0] == "vision 2/2, llm 2/2" and rows["none"][0] == "vision 0/2, llm 0/2"
    assert rows["adaptive"][5] == "yes", rows
    assert len({r[6] for r in rows.values()}) == 1, rows  # recompute changes no loss
