"""tools/balance.py: no torch, the table on a small file, and the figures on the real
OmniBal length statistics (../shared/data/omnibal_lengths, skipped where absent)."""

import gzip
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TOOL = ROOT / "tools" / "balance.py"
REAL = ROOT.parent / "shared" / "data" / "omnibal_lengths"


def parse(stdout):
    rows = [[c.strip() for c in l.split("|")[1:-1]] for l in stdout.splitlines()
            if l.startswith("| ") and not l.startswith("| batching")]
    return {r[0]: [float(x) for x in r[2:6]] for r in rows}  # spg, pad, vision, llm


@pytest.mark.processes
def test_tool_table_without_torch(tmp_path):
    rng = random.Random(0)
    stats = [{"vit_num": rng.randint(1, 5), "token_num": rng.randint(300, 1500),
              "image_flags": 1} for _ in range(1500)]
    with gzip.open(tmp_path / "a.json.gz", "wt") as f:
        json.dump(stats, f)
    code = ("import runpy, sys\n"
            f"sys.argv = ['balance', {str(tmp_path)!r}, '--data-parallel-size', '4', "
            "'--micro-batch-size', '3']\n"
            "try:\n"
            f"    runpy.run_path({str(TOOL)!r}, run_name='__main__')\n"
            "except SystemExit as e:\n"
            "    assert e.code == 0\n"
            "assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = parse(proc.stdout)
    assert list(rows) == ["random", "length-sorted", "isf", "isf-sorted"]
    assert rows["random"][1] > 0.1 and rows["isf"][1] == rows["isf-sorted"][1] == 0
    assert rows["isf-sorted"][3] < rows["random"][3] / 5


@pytest.mark.processes
def test_tool_errors_name_the_flag(tmp_path):
    proc = subprocess.run([sys.executable, str(TOOL), str(tmp_path),
                           "--data-balance-bounds", "18"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "--data-balance-bounds '18'" in proc.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('[{"vit_num": 1}]')
    proc = subprocess.run([sys.executable, str(TOOL), str(bad)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "record 0 lacks vit_num / token_num" in proc.stderr


@pytest.mark.slow  # 70706 samples
@pytest.mark.skipif(not REAL.is_dir(), reason="../shared/data/omnibal_lengths not present")
def test_real_data_dp8_four_per_microbatch():
    from megatron_mm.plan.balance import read_all, search_bounds

    loads = read_all([REAL])
    assert len(loads) == 70706
    best = search_bounds(loads, dp=8, samples_per_group=4, method="isf-sorted", seed=1234)
    m = best.metrics
    assert m.padding == 0 and 4 <= m.samples_per_microbatch <= 5
    assert m.vision_imbalance <= 0.003 and m.llm_imbalance <= 0.035
