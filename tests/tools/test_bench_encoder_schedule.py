"""tools/bench_encoder_schedule.py at tiny sizes with an MoE LLM (--moe: a dense layer,
then experts): the balanced Megatron-Core row and the bubble row run, are simulated, and
compared (timings on a shared machine mean nothing here; the tool's table is the
benchmark)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "bench_encoder_schedule.py"
SMALL = ["--hidden-size", "64", "--ffn-hidden-size", "128", "--moe-ffn-hidden-size", "64",
         "--num-attention-heads", "4", "--num-query-groups", "2", "--vision-hidden-size",
         "64", "--vision-num-layers", "2", "--vision-num-attention-heads", "4",
         "--micro-batch-size", "2", "--global-batch-size", "8"]


def test_bench_encoder_schedule_moe_tiny(tmp_path):
    png = tmp_path / "t.png"
    proc = subprocess.run(
        [sys.executable, str(TOOL), "--moe", "--schedules", "megatron-auto", "bubble",
         "--iters", "1", "--warmup", "0", "--rounds", "1", "--png-out", str(png), *SMALL],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {line.split("|")[1].strip(): line for line in proc.stdout.splitlines()
            if line.startswith("| ") and line.split("|")[1].strip() in
            ("megatron-auto", "bubble")}
    assert set(rows) == {"megatron-auto", "bubble"}, proc.stdout
    assert "MoE: layer 0 dense, layers 1-3 8 experts top-2" in proc.stdout
    assert "bubble / megatron-auto (the fastest of each) iteration time:" in proc.stdout
    assert png.exists()
