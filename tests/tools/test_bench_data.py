"""Smoke test of tools/bench_data.py: a tiny synthetic file, both readers, the table."""

from pathlib import Path

import pytest
from tool_runs import run_tool

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]


def test_bench_data_tiny(tmp_path):
    proc = run_tool(ROOT / "tools" / "bench_data.py", "--records", "300",
                    "--micro-batch-size", "2", "--workdir", tmp_path, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in proc.stdout.splitlines()
            if line.startswith("| 300 ")]
    assert [r[2].split()[0] for r in rows] == ["eager", "lazy"]
    for row in rows:
        assert float(row[3]) > 0 and float(row[5]) >= 0
    assert float(rows[1][6]) > 0  # the lazy reader's index
