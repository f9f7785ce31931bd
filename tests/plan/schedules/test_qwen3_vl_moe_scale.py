"""Qwen3-VL-MoE at cluster scale (``tools/plan.py --qwen3-vl-moe-table``): Megatron-
Bridge's 30B-A3B layout (TP 4, PP 2, EP 4 on 8 H100) with Megatron's schedule, with the
planner's encoder schedule, and the planner's own layout and schedule. The 235B-A22B rows
(256 GPUs) take minutes: the tool prints them."""

import pytest

from megatron_mm.plan.costs import flops
from megatron_mm.reproductions.qwen3_vl_moe_scale import RUNS, compare, model


def test_the_models_have_their_published_sizes():
    """About 30B and 235B parameters (the ViT's included), 3.3B and 22B of the LLM's
    active per token (counted as Qwen counts them: with the embedding and output layer)."""
    for name, total, active in (("Qwen3-VL-30B-A3B", 30.5e9, 3.3e9),
                                ("Qwen3-VL-235B-A22B", 235e9, 22e9)):
        spec = model(name)
        layer = flops.transformer_layer(spec.llm, 1, 1, True)
        ends = 2 * spec.llm.vocab_size * spec.llm.hidden_size  # embedding, output layer
        vit = spec.encoders[0].transformer.num_layers * flops.transformer_layer(
            spec.encoders[0].transformer, 1, 1, False).params
        assert spec.llm.num_layers * layer.params + ends + vit == pytest.approx(total, rel=0.03)
        active_llm = spec.llm.num_layers * layer.fwd / 2 + ends  # 2 FLOPs per weight
        assert active_llm == pytest.approx(active, rel=0.05)


def test_bridge_layout_against_the_planner_30b():
    rows, info = compare(RUNS[0])
    bridge, planned_schedule, planner_megatron, planner = rows
    assert bridge.layout == planned_schedule.layout == "TP 4 PP 2 EP 4 DP 1"
    assert bridge.schedule == "megatron" and bridge.hidden is None
    # the encoder in the LLM's bubbles beats Megatron's schedule on Bridge's layout ...
    assert planned_schedule.iteration_s < bridge.iteration_s
    assert planned_schedule.schedule.split(",")[0] in ("coarse", "bubble")
    assert 0.0 < planned_schedule.hidden <= 1.0
    # ... and the planner's layout and schedule are at least as fast
    assert planner.iteration_s <= min(planned_schedule.iteration_s,
                                      planner_megatron.iteration_s) + 1e-9
    for r in rows:
        assert r.tokens_per_s == pytest.approx(64 * 4096 / r.iteration_s)
    assert info["layouts"] >= 2
