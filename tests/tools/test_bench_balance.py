"""tools/bench_balance.py end to end at its tiniest setting on native-resolution
(Qwen2.5-VL-shaped) data, through the Qwen2.5-VL and the Qwen3-VL towers: the DP=2 rows
(random / balanced) through one tower and the CP=2 rows (zigzag / ours) through the other,
in order, each with its baseline and ratios;
the CP rows train on the same micro-batches (only the token assignment differs). Speed is
never asserted."""

from pathlib import Path

import pytest
from tool_runs import run_tool

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
DP_ROWS = [("dp2-random", "dp2-random"), ("dp2-balanced", "dp2-random")]
CP_ROWS = [("cp2-zigzag", "cp2-zigzag"), ("cp2-balanced", "cp2-zigzag")]


# The DP rows through one tower and the CP rows through the other (``--rows``; every row
# of both in one run each would double the suite's time here for no other path).
@pytest.mark.parametrize("family,expected", [("qwen2_5_vl", DP_ROWS), ("qwen3_vl", CP_ROWS)])
def test_native_resolution_rows(tmp_path, family, expected):
    proc = run_tool(
        ROOT / "tools" / "bench_balance.py", "--family", family,
         "--samples", "24", "--steps", "2", "--warmup", "1", "--hidden-size", "64",
         "--seq-length", "256", "--max-side", "112", "--micro-batch-size", "2",
         "--microbatches", "1", "--rows", expected[1][0], cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    header = next(line for line in lines if line.startswith("| row"))
    table = [[c.strip() for c in line.split("|")[1:-1]] for line in lines
             if line.startswith("| ") and line[2].isalpha() and line != header]
    assert [(r[0], r[1]) for r in table] == expected, proc.stdout
    assert all(len(r) == len(header.split("|")) - 2 for r in table)
    rows = {r[0]: [float(x) for x in r[2:]] for r in table}
    for name, (time, rate, samples, real, computed, time_ratio, rate_ratio) in rows.items():
        assert time > 0 and rate > 0 and samples > 0 and 0 < real <= computed, name
    for name, base in expected:  # ratios to the baseline
        # (the printed times are rounded to 1 ms)
        assert abs(rows[name][5] - rows[name][0] / rows[base][0]) < 0.03, name
        if name == base:
            assert rows[name][5] == rows[name][6] == 1.0
    if expected == CP_ROWS:  # the CP rows read the same random micro-batches: only the
        assert rows["cp2-zigzag"][2:5] == rows["cp2-balanced"][2:5]  # assignment differs
