"""tools/plan.py --optimus-schedule-table prints Optimus' runs beside the paper's figures."""

import json
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "plan.py"


def test_optimus_schedule_table(tmp_path):
    out = tmp_path / "plans.json"
    proc = subprocess.run([sys.executable, str(TOOL), "--optimus-schedule-table", "--json",
                           str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| Optimus")]
    assert [row.split(" | ")[1] for row in rows] == ["1536", "2048", "3072", "8"]
    assert "| 5.91 / 5.87 / 4.87 | 1.21x | 68.7% / 85.0% |" in rows[2]
    assert len(json.loads(out.read_text())) == 4
    assert "2 image(s) of 224 x 224" in proc.stdout
