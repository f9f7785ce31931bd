"""The planner's partition as stock Megatron-LM flags: the layout string parses in
Megatron-Core (``PipelineParallelLayerLayout``, ``TransformerConfig``) and gives each
chunk the LLM layers the planner chose; the first / last stage counts, where printed,
give the same through Megatron-Core's uneven split; the recompute flags say the plan's
recompute; a partition Megatron-LM cannot build is refused."""

import pytest
import torch
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.enums import LayerType
from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout
from megatron.core.transformer.transformer_block import get_num_layers_to_build

from megatron_mm.plan import Workload, build_chain, plan_pipeline
from megatron_mm.plan.errors import PlanError
from megatron_mm.plan.pipeline.megatron_lm_args import llm_layout_args, megatron_lm_args
from megatron_mm.reproductions import model_zoo


def _chain(recompute=False, frozen=False):
    model = model_zoo.model_pair("VLM-S", 336, 336, 30.0).with_freeze(frozen, False, False)
    return build_chain(model, Workload(seq_length=1600, micro_batch_size=1, recompute=recompute))


def _llm_layers(chain, part):
    return [sum(1 for l in chain[s:e] if l.kind == "llm_layer") for s, e in part.chunk_bounds()]


def _config(pp, vpp, **uneven):
    return TransformerConfig(num_layers=32, hidden_size=64, num_attention_heads=4,
                             pipeline_model_parallel_size=pp, pipeline_dtype=torch.float32,
                             virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
                             **uneven)


@pytest.mark.parametrize("pp, vpp, policy, frozen", [
    (4, 1, "encoder-first-stage", True), (4, 1, "encoder-first-stage", False),
    (2, 2, "encoder-first-stage", True), (4, 1, "uniform", False),
    (3, 1, "encoder-first-stage", False), (2, 2, [27 + 4, 10, 6, 12 + 1], False)])
def test_the_layout_parses_in_megatron_core_and_gives_the_planned_partition(pp, vpp, policy,
                                                                            frozen):
    chain = _chain(frozen=frozen)
    plan = plan_pipeline(chain, pp, vpp, policy, num_microbatches=8)
    args = megatron_lm_args(plan.chain, plan.partition)
    chosen = _llm_layers(chain, plan.partition)
    assert args.decoder_layers_per_chunk == chosen
    layout = PipelineParallelLayerLayout(args.pipeline_model_parallel_layout, pp)
    assert layout.virtual_pipeline_model_parallel_size == vpp
    layout.validate_layer_layout(num_layers=32, mtp_num_layers=None)
    for r in range(pp):
        for v in range(vpp):
            assert layout.layout[r][v].count(LayerType.decoder) == chosen[v * pp + r], (r, v)
    # ... and through Megatron-Core's TransformerConfig, as --pipeline-model-parallel-layout
    config = _config(pp, vpp, pipeline_model_parallel_layout=args.pipeline_model_parallel_layout)
    assert config.pipeline_model_parallel_layout.flatten_layout == layout.flatten_layout
    i = args.layout_flags().index("--pipeline-model-parallel-layout")
    assert args.layout_flags()[i + 1] == args.pipeline_model_parallel_layout
    if args.uneven_flags is not None:  # the shorter form gives the same split
        given = dict(zip(args.uneven_flags[::2], map(int, args.uneven_flags[1::2])))
        uneven = _config(pp, vpp, num_layers_in_first_pipeline_stage=given.get(
            "--decoder-first-pipeline-num-layers"), num_layers_in_last_pipeline_stage=given.get(
            "--decoder-last-pipeline-num-layers"))
        for r in range(pp):
            for v in range(vpp):
                assert get_num_layers_to_build(uneven, vp_stage=v, pp_rank=r) == \
                    chosen[v * pp + r], (r, v, args.uneven_flags)


def test_first_and_last_stage_counts_where_they_suffice():
    chain = _chain()
    # [embed, ViT, projector, 7 LLM] [9] [9] [7 + output]: the middle stages alike
    part = plan_pipeline(chain, 4, 1, [27 + 7, 9, 9, 8], num_microbatches=8).partition
    args = megatron_lm_args(chain, part)
    assert args.uneven_flags == ["--decoder-first-pipeline-num-layers", "7",
                                 "--decoder-last-pipeline-num-layers", "7"]
    assert args.flags() == ["--pipeline-model-parallel-size", "4"] + args.uneven_flags
    # Megatron-Core's even split: no layer flags at all
    even = megatron_lm_args(chain, plan_pipeline(chain, 4, 1, "uniform").partition)
    assert even.uneven_flags == [] and even.flags() == ["--pipeline-model-parallel-size", "4"]
    # middle stages that differ: only the layout says it
    odd = megatron_lm_args(chain, plan_pipeline(chain, 4, 1, [27 + 7, 8, 10, 8]).partition)
    assert odd.uneven_flags is None and odd.flags() == odd.layout_flags()


def test_recompute_flags():
    chain = _chain(recompute=True)
    part = plan_pipeline(chain, 2, 1, "encoder-first-stage").partition
    assert megatron_lm_args(chain, part).recompute_flags == [
        "--recompute-granularity", "full", "--recompute-method", "uniform",
        "--recompute-num-layers", "1"]
    same = megatron_lm_args(_chain(), part, [{"llm": 3, "vision": 0}, {"llm": 3}])
    assert same.recompute_flags[-3:] == ["block", "--recompute-num-layers", "3"]
    assert same.notes == []
    differ = megatron_lm_args(_chain(), part, [{"llm": 1, "vision": 4}, {"llm": 3}])
    assert differ.recompute_flags[-1] == "3"
    assert any("[1, 3] LLM layers per chunk" in n for n in differ.notes), differ.notes
    assert any("'vision' recomputes [4, 0]" in n for n in differ.notes), differ.notes


def test_an_encoder_past_the_first_stage_is_refused():
    chain = _chain()
    part = plan_pipeline(chain, 2, 1, [10, len(chain) - 10]).partition
    with pytest.raises(PlanError, match="past the first pipeline stage.*encoder-first-stage"):
        megatron_lm_args(chain, part)


def test_a_stage_without_llm_layers_is_said_by_the_layout():
    """[2, 0] LLM layers (the planner's auto for a tiny LLM at PP=2): the first-stage count
    would leave the last stage none, which Megatron-Core's TransformerConfig refuses
    ("0 middle layers remaining but 1 middle PP stages"): the layout says it."""
    args = llm_layout_args([2, 0], 2, 1)
    assert args.uneven_flags is None and args.pipeline_model_parallel_layout == "Et*2|L"
    config = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4,
                               pipeline_model_parallel_size=2, pipeline_dtype=torch.float32,
                               pipeline_model_parallel_layout=args.pipeline_model_parallel_layout)
    layout = config.pipeline_model_parallel_layout.layout
    assert [layout[r][0].count(LayerType.decoder) for r in range(2)] == [2, 0]
