"""tools/cp_balance.py: runs without torch and our assignment stays within 1.03."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "cp_balance.py"


def test_table_without_torch_and_ours_balanced():
    code = ("import runpy, sys\n"
            f"sys.argv = ['cp_balance', '--seq-lengths', '8192', '--seeds', '2']\n"
            f"try:\n    runpy.run_path({str(TOOL)!r}, run_name='__main__')\n"
            "except SystemExit as e:\n    assert not e.code\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = [line.split() for line in proc.stdout.splitlines()[2:]]
    assert {line[0] for line in lines} == {"causal", "prefix_lm", "encoder_embedded",
                                          "packed"}
    for family, _, contiguous, zigzag, lpt, ours, bound in lines:
        assert float(bound) <= float(ours) <= 1.03, family
        assert float(ours) <= float(contiguous) and float(ours) <= float(zigzag) + 1e-3
