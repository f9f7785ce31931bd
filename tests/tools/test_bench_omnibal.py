"""tools/bench_omnibal.py end to end at its tiniest setting (PP=2, DP=1, one timed
iteration, a 2-layer ViT and LLM): the four rows in order, their columns, the
iteration-1 losses equal where the data is the same, and the last line. Speed is never
asserted. The statistics are a small file in OmniBal's format, written here."""

import gzip
import json
import random
import re
from pathlib import Path

import pytest
from tool_runs import run_tool

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
ROWS = ["1. megatron", "2. + balanced data", "3. + partition search",
        "4. + adaptive recompute", "5. + adaptive recompute, tighter memory"]


def _stats(path: Path) -> Path:
    """OmniBal's per-sample format: 1 to 4 tiles (+ thumbnail), 256 tokens a tile."""
    rng = random.Random(0)
    rows = []
    for _ in range(200):
        tiles = rng.choice([1, 3, 4, 5])
        rows.append({"vit_num": tiles, "token_num": 256 * tiles + rng.randint(30, 300),
                     "image_flags": tiles})
    out = path / "tiny_wh_token_lengths.json.gz"
    out.write_bytes(gzip.compress(json.dumps(rows).encode()))
    return out


def test_bench_omnibal_tiny(tmp_path):
    proc = run_tool(
        ROOT / "tools" / "bench_omnibal.py", _stats(tmp_path),
         "--samples", "48", "--rounds", "1", "--iters", "1", "--warmup", "0",
         "--data-parallel-size", "1", "--hidden-size", "64", "--num-layers", "2",
         "--microbatches", "2", "--micro-batch-size", "2", "--search-candidates", "2",
         "--search-iters", "1", cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    table = [[c.strip() for c in line.split("|")[1:-1]] for line in lines
             if line.startswith("| ") and line[2].isdigit()]
    assert [r[0] for r in table] == ROWS, proc.stdout
    header = next(line for line in lines if line.startswith("| row"))
    assert all(len(r) == len(header.split("|")) - 2 for r in table)
    for r in table:
        assert float(r[1]) > 0 and float(r[3]) > 0 and float(r[8]) > 0
    assert table[0][2] == table[0][4] == "1.000"
    # full recompute (rows 1-3) and the budgets' choices (rows 4, 5) per stage
    assert table[0][6] == table[1][6] == table[2][6]
    budgets = re.search(r"budgets ([0-9.]+) and ([0-9.]+) GB", proc.stdout)
    assert float(budgets.group(1)) >= float(budgets.group(2)) > 0
    assert re.search(r"rows 2-5 \(same data\).* -> equal", proc.stdout), proc.stdout
    assert re.search(r"row 1 vs row 1's data.* -> equal", proc.stdout), proc.stdout
    assert re.fullmatch(r"all three / megatron tokens per second: \d+\.\d{3}", lines[-1])
