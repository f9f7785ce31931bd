"""tools/bench_sequence_parallel.py at tiny sizes (two 2-rank runs): both rows, the same
loss, and a lower activation peak with sequence parallelism (run as the command line runs
it, on a forked rank: ``tool_runs``)."""

from pathlib import Path

import pytest
from tool_runs import run_tool

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "bench_sequence_parallel.py"


def test_bench_sequence_parallel_tiny():
    proc = run_tool(
        TOOL, "--num-layers", "2", "--hidden-size", "64",
         "--num-attention-heads", "4", "--seq-length", "64", "--vision-model-type", "siglip",
         "--vision-hidden-size", "32", "--vision-num-layers", "2",
         "--vision-num-attention-heads", "2", "--img-h", "16", "--img-w", "16",
         "--patch-dim", "4", "--micro-batch-size", "4", "--global-batch-size", "4",
         "--lr", "1e-4", "--skip-final-eval", "--bench-iters", "1", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in proc.stdout.splitlines() if line.startswith("| TP=2")}
    assert set(rows) == {"TP=2", "TP=2 --sequence-parallel"}, proc.stdout
    assert rows["TP=2"][3] == rows["TP=2 --sequence-parallel"][3], rows  # the same loss
    assert float(rows["TP=2 --sequence-parallel"][2]) < 1.0, rows
