"""Schedules as data: generators pass the validator, broken schedules are named, and the
simulator reproduces the textbook 1F1B bubble."""

import json

import pytest

from megatron_mm.plan import PlanError
from megatron_mm.plan.schedules.problem import ScheduleProblem
from megatron_mm.plan.schedules.actions import Action, Schedule, validate
from megatron_mm.plan.schedules.bubble import bubble
from megatron_mm.plan.schedules.dataflow import dataflow
from megatron_mm.plan.schedules.generate import coarse, encoder_placement, llm_order, megatron
from megatron_mm.plan.schedules.simulate import ActionCosts, simulate


@pytest.mark.parametrize("pp, vpp, m", [(2, 1, 4), (4, 1, 8), (2, 2, 4), (4, 2, 8), (4, 1, 2)])
def test_megatron_schedules_are_valid(pp, vpp, m):
    validate(megatron(pp, vpp, m))


@pytest.mark.parametrize("pp, vpp, stages, trainable", [
    (2, 1, 2, True), (4, 1, 4, False), (4, 2, 2, True), (2, 2, 1, False)])
def test_coarse_schedules_are_valid(pp, vpp, stages, trainable):
    validate(coarse(ScheduleProblem(pp, 2 * pp, virtual_pipeline_model_parallel_size=vpp,
                                    encoder_trainable=trainable, encoder_stages=stages)))


def _costs(pp, vpp, pieces, encoder_f, encoder_b):
    """LLM forward 1, backward 2 per micro-batch and stage; the whole encoder's forward and
    backward per micro-batch spread over ``pp * pieces`` equal pieces."""
    n = pp * pieces
    return ActionCosts([1.0 / vpp] * pp * vpp, [2.0 / vpp] * pp * vpp,
                       [encoder_f / n] * n, [encoder_b / n] * n, p2p_s=0.01)


def _on_stage_0(costs: ActionCosts, trainable: bool) -> ActionCosts:
    """The Megatron baseline's costs: the whole encoder inside LLM chunk 0."""
    f = [costs.forward_s[0] + sum(costs.encoder_forward_s)] + costs.forward_s[1:]
    b = [costs.backward_s[0] + (sum(costs.encoder_backward_s) if trainable else 0.0)]
    return ActionCosts(f, b + costs.backward_s[1:], p2p_s=costs.p2p_s)


@pytest.mark.parametrize("pp, vpp, pieces, trainable, reverse", [
    (2, 1, 1, True, False), (2, 1, 3, False, True), (4, 1, 2, True, True),
    (4, 1, 1, False, False), (2, 2, 2, True, False), (4, 2, 1, False, True)])
def test_bubble_schedules_are_valid_and_beat_the_baseline(pp, vpp, pieces, trainable,
                                                          reverse):
    m = 2 * pp
    costs = _costs(pp, vpp, pieces, 2.0 * pp, 4.0 * pp)  # an encoder-heavy model
    schedule = bubble(ScheduleProblem(pp, m, virtual_pipeline_model_parallel_size=vpp,
                                      encoder_trainable=trainable, costs=costs, encoder_stages=pp,
                                      pieces=pieces, reverse=reverse))
    validate(schedule)  # bubble() validates too; keep the contract visible
    assert Schedule.from_dict(json.loads(json.dumps(schedule.to_dict()))) == schedule
    baseline = simulate(megatron(pp, vpp, m), _on_stage_0(costs, trainable)).iteration_s
    assert simulate(schedule, costs).iteration_s < 0.85 * baseline


@pytest.mark.parametrize("generator", ["coarse", "bubble"])
@pytest.mark.parametrize("frozen", [[], [0], [1]])
def test_two_encoders_run_as_two_pipelines_into_the_first_chunk(generator, frozen):
    """Vision and audio: F(m, 0) waits for both encoders' last pieces, each encoder's
    pieces chain on their own, and a frozen encoder beside a trainable one runs no EB."""
    pp, m = 2, 4
    costs = _costs(pp, 1, 1, 2.0, 4.0)
    costs = ActionCosts(costs.forward_s, costs.backward_s, costs.encoder_forward_s * 2,
                        costs.encoder_backward_s * 2, p2p_s=costs.p2p_s)
    schedule = (coarse(ScheduleProblem(pp, m, encoder_stages=pp, encoders=2,
                                       frozen_encoders=frozen))
                if generator == "coarse" else
                bubble(ScheduleProblem(pp, m, costs=costs, encoder_stages=pp, encoders=2,
                                       frozen_encoders=frozen)))
    validate(schedule)
    assert schedule.encoder_spans() == [(0, 2), (2, 4)]
    assert schedule.encoder_ranks == [0, 1, 0, 1]
    assert schedule.dependencies(Action("F", 1, 0)) == [("EF", 1, 1), ("EF", 1, 3)]
    assert schedule.dependencies(Action("EF", 1, 2)) == []  # audio's first piece
    assert schedule.dependencies(Action("EB", 1, 1)) == [("B", 1, 0), ("EF", 1, 1)]
    backwards = {a.chunk for r in schedule.ranks for a in r if a.kind == "EB"}
    assert backwards == {0, 1, 2, 3} - {s for e in frozen for s in range(2 * e, 2 * e + 2)}
    assert Schedule.from_dict(json.loads(json.dumps(schedule.to_dict()))) == schedule
    sim = simulate(schedule, costs)
    assert sum(sim.encoder_busy_s) == pytest.approx(
        m * (2 * 2.0 + 4.0 * (2 - len(frozen))))


def test_encoder_pieces_that_do_not_add_up_are_named():
    broken = coarse(ScheduleProblem(2, 2, encoders=2))
    broken.encoder_pieces = [1, 2]
    with pytest.raises(PlanError, match=r"encoder pieces \[1, 2\] do not add up"):
        validate(broken)
    broken = coarse(ScheduleProblem(2, 2, encoders=2))
    broken.frozen_encoders = [2]
    with pytest.raises(PlanError, match=r"frozen encoders \[2\] are not among its 2"):
        validate(broken)


def test_bubble_hides_a_light_frozen_encoder_in_the_bubbles():
    pp, m = 4, 8
    costs = _costs(pp, 1, 2, 1.6, 0.0)
    llm_only = simulate(megatron(pp, 1, m), ActionCosts([1.0] * pp, [2.0] * pp)).iteration_s
    sim = simulate(bubble(ScheduleProblem(pp, m, encoder_trainable=False, costs=costs,
                                          encoder_stages=pp, pieces=2, reverse=True)), costs)
    # 8 micro-batches x 1.6 s of encoder work, of which only ~2 s shows
    assert sim.iteration_s < llm_only + 0.2 * m * 1.6
    coarse_s = simulate(coarse(ScheduleProblem(pp, m, encoder_trainable=False, encoder_stages=pp,
                                               pieces=2, reverse=True)), costs).iteration_s
    assert sim.iteration_s < coarse_s


@pytest.mark.parametrize("vpp", [1, 2])
def test_extra_warmup_is_valid_and_auto_keeps_the_fastest(vpp):
    pp, m = 4, 8
    costs = _costs(pp, vpp, 2, 2.0 * pp, 4.0 * pp)
    times = []
    for extra in (0, 1, 2):
        schedule = bubble(ScheduleProblem(pp, m, virtual_pipeline_model_parallel_size=vpp,
                                          costs=costs, encoder_stages=pp, pieces=2),
                          extra_warmup=extra)
        times.append(simulate(schedule, costs).iteration_s)
    def forwards_before_first_backward(order):
        return [a.kind for a in order].index("B")

    assert forwards_before_first_backward(llm_order(pp, vpp, m, 0, extra_warmup=2)) == (
        forwards_before_first_backward(llm_order(pp, vpp, m, 0)) + 2)
    for in_flight in sorted({pp, pp + 1, pp + 2, pp * vpp}):  # the dataflow orders
        for ahead in (pp, 2 * pp):
            schedule = dataflow(ScheduleProblem(pp, m, virtual_pipeline_model_parallel_size=vpp,
                                                costs=costs, encoder_stages=pp, pieces=2),
                                max_in_flight=in_flight, max_encoder_ahead=ahead)
            times.append(simulate(schedule, costs).iteration_s)
    auto = bubble(ScheduleProblem(pp, m, virtual_pipeline_model_parallel_size=vpp, costs=costs,
                                  encoder_stages=pp, pieces=2), extra_warmup="auto")
    assert simulate(auto, costs).iteration_s == pytest.approx(min(times))


def test_encoder_placement_checks_the_encoder_pipeline_size():
    assert encoder_placement(4, 2, 2) == (2, [0, 0, 2, 2])
    assert encoder_placement(4, 2, 1, reverse=True) == (2, [3, 1])
    with pytest.raises(PlanError, match="--encoder-pipeline-model-parallel-size"):
        encoder_placement(4, 3)


def test_megatron_1f1b_order_on_the_first_rank():
    # PP=2: one warm-up forward, then 1F1B, then the last backward
    assert [str(a.kind) + str(a.microbatch) for a in llm_order(2, 1, 3, 0)] == [
        "F0", "F1", "B0", "F2", "B1", "B2"]


def test_simulated_1f1b_has_the_textbook_bubble():
    # equal stages (forward 1 s, backward 2 s): (M + PP - 1) x 3 s
    pp, m = 4, 8
    sim = simulate(megatron(pp, 1, m), ActionCosts([1.0] * pp, [2.0] * pp))
    assert sim.iteration_s == pytest.approx((m + pp - 1) * 3.0)
    assert sim.bubble_fraction == pytest.approx((pp - 1) / (m + pp - 1))
    assert all(b == pytest.approx(m * 3.0) for b in sim.busy_s)
    interleaved = simulate(megatron(pp, 2, m), ActionCosts([0.5] * 8, [1.0] * 8))
    assert interleaved.iteration_s < sim.iteration_s  # VPP shrinks the bubble
    trace = sim.chrome_trace()
    assert len([e for e in trace["traceEvents"] if e["ph"] == "X"]) == 2 * pp * m
    json.dumps(trace)


def test_broken_schedules_name_the_problem():
    good = megatron(2, 1, 2)
    swapped = Schedule.from_dict(good.to_dict())
    swapped.ranks[1] = [Action("B", 0, 1), Action("F", 0, 1)] + swapped.ranks[1][2:]
    with pytest.raises(PlanError, match=r"rank 1 waits in B\(micro-batch 0, chunk 1\) for "
                                        r"F\(micro-batch 0, chunk 1\)"):
        validate(swapped)
    missing = Schedule.from_dict(good.to_dict())
    missing.ranks[0] = missing.ranks[0][:-1]
    with pytest.raises(PlanError, match=r"never runs B\(micro-batch 1, chunk 0\)"):
        validate(missing)
    frozen = coarse(ScheduleProblem(2, 2, encoder_trainable=False))
    frozen.ranks[0].append(Action("EB", 0, 0))
    with pytest.raises(PlanError, match="a frozen encoder has no backward"):
        validate(frozen)


@pytest.mark.processes
def test_simulate_schedule_tool(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    tool = Path(__file__).resolve().parents[3] / "tools" / "simulate_schedule.py"
    proc = subprocess.run([sys.executable, str(tool), "--encoder-forward", "2",
                           "--encoder-backward", "4", "--trace-out", str(tmp_path / "t.json"),
                           "--png-out", str(tmp_path / "t.png")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    # the encoder on stage 0 makes it the bottleneck: (2 + 4 + 3) x 8 micro-batches
    assert "| megatron | 72.00 | 0.500 |" in proc.stdout
    assert "| coarse | 45.00 | 0.200 |" in proc.stdout
    # two pieces per rank, encoder ending on rank 0: some encoder work fills the bubbles
    assert "| bubble | 43.50 | 0.172 |" in proc.stdout
    assert "| 12% |" in proc.stdout.splitlines()[-1]
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"


def _simulate_tool():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "tools" / "simulate_schedule.py"
    spec = importlib.util.spec_from_file_location("simulate_schedule", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def test_simulate_schedule_defaults_show_the_encoder(tmp_path, capsys):
    """The defaults (a trained encoder of twice an LLM chunk's forward) tell the schedules
    apart; --help gives the costs' units; the PNG has a legend (each kind's colour, top
    left) and a time axis under each schedule."""
    from PIL import Image

    from megatron_mm.plan.schedules.timeline import COLOURS

    tool = _simulate_tool()
    assert tool.main(["--png-out", str(tmp_path / "t.png")]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines()
            if line.startswith(("| megatron", "| coarse", "| bubble"))]
    assert len({row.split("|")[2] for row in rows}) == 3, rows  # three iteration times
    with pytest.raises(SystemExit):
        tool.main(["--help"])
    assert "in time units" in capsys.readouterr().out
    image = Image.open(tmp_path / "t.png").convert("RGB")
    assert image.getpixel((10, 12)) == COLOURS["F"]  # the legend's first swatch
    black = [y for y in range(image.height) if image.getpixel((300, y)) == (0, 0, 0)]
    assert len(black) >= 3  # one axis per schedule
