"""tools/plan.py --optimus-schedule-table prints Optimus' runs beside the paper's figures.

The 8-GPU run only (the cluster-scale rows take minutes of planning; the 3072-GPU plan is
checked in process by tests/plan/schedules/test_encoder_planner.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

TOOL = Path(__file__).resolve().parents[2] / "tools" / "plan.py"


def _run(*argv):
    return subprocess.run([sys.executable, str(TOOL), "--optimus-schedule-table", *argv],
                          capture_output=True, text=True, timeout=300)


def test_optimus_schedule_table(tmp_path):
    out = tmp_path / "plans.json"
    proc = _run("--optimus-gpus", "8", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| Optimus")]
    assert [row.split(" | ")[1] for row in rows] == ["8"]
    assert "| 3.42 / 3.04 / 2.78 | 1.23x |" in rows[0]
    speedup = float(rows[0].split(" | ")[7].rstrip("x"))
    assert speedup >= 1.23  # at least the paper's
    assert len(json.loads(out.read_text())) == 1
    assert "2 image(s) of 224 x 224" in proc.stdout


def test_optimus_gpus_without_a_run_is_an_error():
    proc = _run("--optimus-gpus", "5")
    assert proc.returncode == 2
    assert "--optimus-gpus [5]: no Optimus run on those GPU counts" in proc.stderr
