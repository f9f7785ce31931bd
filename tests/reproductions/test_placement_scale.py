"""The cluster-scale placement table (``reproductions/placement_scale.py``, ``tools/plan.py
--placement-table``): Optimus' 8-GPU setup on its heavy workload, the encoder trained and
frozen (the cluster-scale rows take minutes of planning)."""

from dataclasses import replace

import pytest

from megatron_mm.plan.costs.hardware import A100, A100_LINKS
from megatron_mm.plan.schedules.action_costs import CostModel
from megatron_mm.reproductions import placement_scale as ps

SMALL = next(s for s in ps.SETUPS if s.gpus == 8)


@pytest.fixture(scope="module")
def heavy():
    return [ps.row(SMALL, "heavy", trains) for trains in (True, False)]


def test_table_prints_every_placement_and_the_published_figures(heavy):
    lines = ps.table(heavy, [SMALL])
    rows = [line for line in lines if line.startswith("| Optimus-small-224 |")]
    assert len(rows) == 2
    for r, line in zip(heavy, rows):
        cells = line.split(" | ")
        assert cells[3:5] == ["trained" if r.encoder_trains else "frozen",
                              f"{r.encoder_over_bubble:.2f}"]
        assert cells[6] == f"{r.frozen_aware_s:.2f} ({r.speedups()['frozen-aware']:.2f}x)"
        assert cells[9] == r.best
    published = lines[lines.index("") + 3:]
    systems = {line.split(" | ")[0][2:] for line in published}
    assert systems == {p.system for p in ps.PUBLISHED}
    assert {"DistTrain", "Optimus", "LoongForge"} <= systems
    assert "1.23x (8 A100) |" in next(line for line in published if line.startswith("| Optimus |"))


def test_row_relations(heavy):
    trained, frozen = heavy
    for r in heavy:
        ups = r.speedups()
        assert r.best == max(dict(ups, **{"Megatron-LM": 1.0}), key=dict(
            ups, **{"Megatron-LM": 1.0}).get)
        # the separate pick is the grid's highest throughput and uses every GPU
        sep = r.separate
        assert sep is not None and r.separate_tried >= 1
        llm = SMALL.layout.tensor_model_parallel_size * sep.pipeline_model_parallel_size
        assert (llm * sep.data_parallel_size + sep.encoder_tensor_model_parallel_size
                * sep.encoder_data_parallel_size) == SMALL.gpus
        # the frozen-aware partition: every LLM layer once, fewer beside the encoder
        layers = r.frozen_aware_layers
        assert sum(layers) == SMALL.spec(1, True).llm.num_layers
        assert len(layers) == SMALL.layout.pipeline_model_parallel_size
        assert layers[0] < max(layers[1:])
    # freezing the encoder removes its backward: no placement gets slower, and less
    # encoder work is left for the bubbles
    assert frozen.megatron_lm_s < trained.megatron_lm_s
    assert frozen.encoder_over_bubble < trained.encoder_over_bubble
    assert frozen.separate.iteration_s <= trained.separate.iteration_s
    # a heavier workload puts more encoder work against the same bubbles
    light = ps.row(SMALL, "light", True)
    assert light.encoder_over_bubble < trained.encoder_over_bubble
    assert light.megatron_lm_s < trained.megatron_lm_s


def test_one_cell_is_the_whole_world():
    """LLM replica d talks to encoder replica e only when d = e mod gcd(D, E): one cell's
    iteration is the world's."""
    spec = SMALL.spec(SMALL.heavy, True)
    lay = replace(SMALL.layout, virtual_pipeline_model_parallel_size=1,
                  pipeline_model_parallel_size=2, data_parallel_size=6, global_batch_size=96)
    cell = ps.separate_s(spec, lay, 1, 4, A100, A100_LINKS)
    world = ps.separate_s(spec, lay, 1, 4, A100, A100_LINKS, cell=False)
    # the encoder replicas are the bottleneck here: a wrong cell would change the time
    fewer = replace(lay, data_parallel_size=3, global_batch_size=48)
    assert cell > ps.separate_s(spec, fewer, 1, 4, A100, A100_LINKS, cell=False)
    assert cell == pytest.approx(world, rel=1e-9)


def test_the_encoder_messages_fan_out_as_the_runtime_sends_them():
    """The encoder output to each of the LLM first stage's TP ranks, its gradient to each
    encoder TP rank, all from one rank; the LLM's stage sends as the colocated runs'."""
    spec = SMALL.spec(SMALL.heavy, True)
    lay = replace(SMALL.layout, virtual_pipeline_model_parallel_size=1)  # TP 2
    cm = CostModel(spec, lay, A100, A100_LINKS)
    out = cm.encoders[0].act_bytes
    costs = ps.separate_costs(spec, lay, 4, 1, A100, A100_LINKS)
    assert costs.p2p_s == cm.p2p_s()
    assert costs.encoder_output_p2p_s == [A100_LINKS.p2p_seconds(2 * out)]
    assert costs.encoder_grad_p2p_s == [A100_LINKS.p2p_seconds(4 * out)]
