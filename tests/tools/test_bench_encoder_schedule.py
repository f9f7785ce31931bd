"""tools/bench_encoder_schedule.py at tiny sizes with an MoE LLM (--moe: a dense layer,
then experts), the light workload with a 4-layer ViT: the balanced Megatron-Core row, the
bubble row, the bubble row with the ViT interleaved over the two ranks, the separate row
(the encoder on one rank, the LLM at PP=1 on the other) and the auto row run, are
simulated, and compared (timings on a shared machine mean nothing here; the tool's table
is the benchmark)."""

import re
from pathlib import Path

import pytest
from tool_runs import run_tool

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "bench_encoder_schedule.py"
SMALL = ["--hidden-size", "64", "--ffn-hidden-size", "128", "--moe-ffn-hidden-size", "64",
         "--num-attention-heads", "4", "--num-query-groups", "2", "--vision-hidden-size",
         "64", "--vision-num-layers", "4", "--vision-num-attention-heads", "4",
         "--micro-batch-size", "2", "--global-batch-size", "8"]


def test_bench_encoder_schedule_moe_tiny(tmp_path):
    png = tmp_path / "t.png"
    proc = run_tool(
        TOOL, "--moe", "--workload", "light", "--schedules",
         "megatron-auto", "bubble", "bubble-evpp2", "separate", "auto", "--iters", "1",
         "--warmup", "0",
         "--rounds", "1", "--png-out", png, *SMALL, cwd=ROOT,
        env={"PYTHONPATH": str(ROOT)})  # for the profiling processes it starts
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {line.split("|")[1].split(" (")[0].strip(): line
            for line in proc.stdout.splitlines() if line.startswith("| ")}
    assert {"megatron-auto", "bubble", "bubble-evpp2", "separate", "auto"} <= set(rows), \
        proc.stdout
    assert "| auto (chose " in rows["auto"]  # the planner's pick, from the run's log
    assert "light workload" in proc.stdout
    assert "MoE: layer 0 dense, layers 1-3 8 experts top-2" in proc.stdout
    # the faster bubble row (plain or interleaved: timings here are noise) against it
    assert re.search(r"^bubble(-evpp2)? / megatron-auto \(the fastest of each\) iteration "
                     r"time: ", proc.stdout, re.M), proc.stdout
    last = proc.stdout.splitlines()[-4:]  # the ratios the issue asks for, every row simulated
    assert last[0].startswith("auto (chose "), last
    assert " / fastest fixed placement (" in last[0], last
    assert last[1].startswith("best placement ("), last
    assert " / fastest Megatron-Core row (megatron-auto) iteration time: " in last[1], last
    assert last[2].startswith("no-idle bound (megatron-auto's simulated forward-backward work "
                              "split evenly over its 2 ranks"), last
    assert 0 < float(last[2].rsplit(": ", 1)[1]) < 1, last  # megatron-auto has idle time
    assert last[3].startswith("simulated vs measured iteration time: megatron-auto "), last
    assert "separate " in last[3] and "auto " in last[3], last
    assert png.exists()
