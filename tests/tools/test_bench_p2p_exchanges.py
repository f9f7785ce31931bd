"""tools/bench_p2p_exchanges.py (pure Python, a second): its NCCL model hangs on receives
posted just before their action where two encoders run all forwards first, runs the
executor's timed exchanges, and never beats buffered sends."""

import importlib.util
import math
from pathlib import Path

from megatron_mm.plan.schedules.problem import ScheduleProblem
from megatron_mm.plan.schedules.generate import coarse, megatron
from megatron_mm.plan.schedules.p2p import p2p_program, unit_cost

TOOL = Path(__file__).resolve().parents[2] / "tools" / "bench_p2p_exchanges.py"
spec = importlib.util.spec_from_file_location("bench_p2p_exchanges", TOOL)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_the_model_hangs_on_late_receives_and_runs_timed_ones():
    s = coarse(ScheduleProblem(2, 2, encoder_trainable=False, encoders=2))
    assert bench.nccl_time(s.ranks, p2p_program(s, s.ranks, late=True), unit_cost) == math.inf
    assert bench.nccl_time(s.ranks, p2p_program(s, s.ranks), unit_cost) < math.inf


def test_1f1b_costs_what_its_timeline_says():
    # rank 0: F0 F1 B0 F2 B1 B2 with B0 waiting for rank 1's B0 (ends at 4): 12 units
    s = megatron(2, 1, 3)
    assert bench.nccl_time(s.ranks, p2p_program(s, s.ranks), unit_cost) == 12.0


def test_the_table(capsys):
    bench.main(["--microbatches", "4"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert len(rows) == 2 * (1 + 2 + 2)  # per PP: 1F1B, coarse and bubble x 1 and 2 encoders
    assert [r[4] for r in rows if r[0] == "coarse" and r[2] == "2"] == ["hangs", "hangs"]
    assert all(float(r[6]) >= 1.0 for r in rows), rows
