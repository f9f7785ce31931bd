"""tools/bench_cp_attention.py --calibrate runs at tiny sizes and prints its fit (about 9 s:
one process; the 4-rank timing run spawns ranks and costs more, it is run by hand)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "bench_cp_attention.py"


def test_calibrate_prints_a_fit():
    proc = subprocess.run(
        [sys.executable, str(TOOL), "--calibrate", "--seq-length", "256",
         "--context-parallel-block", "32", "--calibrate-tiles", "1", "2", "4",
         "--heads", "2", "--head-dim", "8", "--iters", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert re.match(r"fit: -?[\d.]+ ms per tile \+ -?[\d.]+ ms per block -> block overhead "
                    r"-?[\d.]+ tiles", last), last
