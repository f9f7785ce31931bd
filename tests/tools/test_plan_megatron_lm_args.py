"""tools/plan.py --megatron-lm-args prints the flags of the chosen partition for a stock
Megatron-LM run; the printed layout parses in Megatron-Core to the planned partition."""

import importlib.util
from pathlib import Path

import pytest
from megatron.core.transformer.enums import LayerType
from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

TOOL = Path(__file__).resolve().parents[2] / "tools" / "plan.py"
ARGV = ["--model-pair", "VLM-S", "--freeze-ViT", "--pipeline-model-parallel-size", "4",
        "--num-microbatches", "8", "--megatron-lm-args"]


def _tool():
    spec = importlib.util.spec_from_file_location("plan_tool", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_prints_the_flags_of_the_encoder_first_stage_plan(capsys):
    assert _tool().main(ARGV + ["--pipeline-partition", "encoder-first-stage",
                                "--recompute-granularity", "full"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| 0 | 0 |")]
    assert "vision[embed, 0-23, projector]" in rows[0]  # the ViT on the first stage
    flags = [line.split() for line in out.splitlines() if "--pipeline-model-parallel-layout"
             in line][0]
    layout = flags[flags.index("--pipeline-model-parallel-layout") + 1]
    parsed = PipelineParallelLayerLayout(layout, 4)
    parsed.validate_layer_layout(num_layers=32, mtp_num_layers=None)
    counts = [parsed.layout[r][0].count(LayerType.decoder) for r in range(4)]
    # the layout's stages hold the LLM layers of the partition the tool printed
    assert sum(counts) == 32 and f"LLM decoder layers per chunk {counts}" in out
    last = [line for line in out.splitlines() if line.startswith("| 3 | 3 |")][0]
    first, end = last.split("llm[")[1].split(",")[0].split("-")
    assert int(end) - int(first) + 1 == counts[3]
    assert flags[-6:] == ["--recompute-granularity", "full", "--recompute-method", "uniform",
                          "--recompute-num-layers", "1"]


def test_a_partition_megatron_lm_cannot_build_is_an_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        _tool().main(ARGV + ["--pipeline-partition", "10,17,17,16"])
    assert exit_.value.code == 2
    assert "past the first pipeline stage" in capsys.readouterr().err
