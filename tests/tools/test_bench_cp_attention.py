"""tools/bench_cp_attention.py --calibrate (about 9 s: one process) and --memory (a process
per row) run at tiny sizes; the 4-rank timing run spawns ranks and costs more, it is run by
hand. Each runs as the command line runs it, on a forked rank (``tool_runs``)."""

import re
from pathlib import Path

import pytest
from tool_runs import run_tool

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "bench_cp_attention.py"


def test_calibrate_prints_a_fit():
    proc = run_tool(TOOL, "--calibrate", "--seq-length", "256", "--context-parallel-block",
                    "32", "--calibrate-tiles", "1", "2", "4", "--heads", "2", "--head-dim",
                    "8", "--iters", "2", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert re.match(r"fit: -?[\d.]+ ms per tile \+ -?[\d.]+ ms per block -> block overhead "
                    r"-?[\d.]+ tiles", last), last


def test_memory_table_ends_with_the_flex_over_einsum_ratio():
    """--memory at tiny sizes: a fresh process per row, a dense row over its budget not
    run, the last line the FlexAttention / einsum peak memory ratio."""
    proc = run_tool(TOOL, "--memory", "--memory-lengths", "256", "1024",
                    "--context-parallel-block", "32", "--heads", "4", "--head-dim", "8",
                    "--iters", "1", "--max-dense-gib", "0.002", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert re.match(r"\s*256\s+\d+\s+[\d.]+\s+[\d.]+(\s+[\d.]+){4}$", lines[-3]), lines[-3]
    # 1024 tokens: the dense scores exceed 0.002 GiB; the einsum's (one rank's 256 rows of
    # 1024 keys, 4 heads: 4 MiB) are well above the resident set's page resolution
    assert "not run" in lines[-2]
    assert re.match(r"FlexAttention / einsum CP attention peak memory at 1024 tokens: "
                    r"[\d.]+$", lines[-1]), lines[-1]
