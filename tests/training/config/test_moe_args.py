"""Megatron-LM's MoE flags: their group, the layer pattern (--moe-layer-freq), what they
become in the LLM's TransformerConfig, and bad combinations refused up front with one line
naming the flag."""

import argparse

import pytest

from megatron_mm.config import ConfigError
from megatron_mm.training.cli.arguments import read_args
from megatron_mm.training.config.moe_args import moe_freq_type
from megatron_mm.training.config.run_config import RunConfig

LLM = ["--vision-model-type", "none", "--num-layers", "4"]
MOE = LLM + ["--num-experts", "4"]


@pytest.mark.parametrize("text, pattern", [
    ("1", (1, 1, 1, 1)), ("2", (1, 0, 1, 0)), ("[0,1,1,1]", (0, 1, 1, 1)),
    ("([0]+[1]*1)*2", (0, 1, 0, 1)),
])
def test_layer_pattern(text, pattern):
    config = read_args(MOE + ["--moe-layer-freq", text], world_size=1).model_config
    assert config.language.moe.pattern(4) == pattern


def test_layer_freq_is_parsed_without_eval():
    with pytest.raises(argparse.ArgumentTypeError):
        moe_freq_type("[__import__('os')]")


def test_flags_make_the_moe_group_and_transformer_config():
    import megatron_mm.prepared  # noqa: F401  (the models package needs the CPU patches)
    from megatron_mm.models.transformer_configs import BuildSettings, language_transformer_config

    args = read_args(MOE + ["--moe-ffn-hidden-size", "32", "--moe-router-topk", "1",
                            "--moe-router-pre-softmax", "--moe-aux-loss-coeff", "0.01",
                            "--moe-layer-freq", "[0,1,1,1]",
                            "--moe-token-dispatcher-type", "alltoall",
                            "--expert-model-parallel-size", "2"], world_size=2)
    run = RunConfig.from_flags(args)
    assert run.moe.num_experts == 4 and run.moe.moe_router_topk == 1
    assert run.parallel.expert_model_parallel_size == 2
    assert run.parallel.expert_tensor_parallel_size == 1  # Megatron-LM's default: the TP
    lm = run.model_config.language
    lm.vocab_size = 256
    config = language_transformer_config(lm, BuildSettings(expert_model_parallel_size=2))
    assert (config.num_moe_experts, config.moe_ffn_hidden_size, config.moe_router_topk) == \
        (4, 32, 1)
    assert config.moe_router_pre_softmax and config.moe_aux_loss_coeff == 0.01
    assert config.moe_layer_freq == [0, 1, 1, 1]
    assert config.moe_token_dispatcher_type == "alltoall"
    assert config.moe_expert_capacity_factor is None  # dropless
    assert (config.expert_model_parallel_size, config.expert_tensor_parallel_size) == (2, 1)


@pytest.mark.parametrize("argv, world, message", [
    (LLM + ["--moe-router-topk", "4"], 1,
     "--moe-router-topk needs an MoE LLM (--num-experts); this LLM is dense"),
    # given at its default value (Megatron-LM's) all the same
    (LLM + ["--moe-router-topk", "2"], 1,
     "--moe-router-topk needs an MoE LLM (--num-experts); this LLM is dense"),
    (LLM + ["--moe-token-dispatcher-type", "allgather"], 1,
     "--moe-token-dispatcher-type needs an MoE LLM (--num-experts); this LLM is dense"),
    (LLM + ["--expert-model-parallel-size", "2"], 2,
     "--expert-model-parallel-size needs an MoE LLM (--num-experts); this LLM is dense"),
    (MOE + ["--expert-model-parallel-size", "3"], 3,
     "--num-experts (4) is not divisible by --expert-model-parallel-size (3)"),
    (MOE + ["--moe-router-topk", "5"], 1,
     "--moe-router-topk (5) must be between 1 and --num-experts (4)"),
    (MOE + ["--moe-router-topk", "1"], 1, "--moe-router-topk 1 needs --moe-router-pre-softmax"),
    (MOE + ["--moe-layer-freq", "[1,0,1]"], 1,
     "--moe-layer-freq lists 3 layers ([1, 0, 1]); give one 0 (dense) or 1 (MoE) per layer"),
    (MOE + ["--tensor-model-parallel-size", "2"], 2,
     "--num-experts with --tensor-model-parallel-size 2 needs --sequence-parallel"),
    (MOE + ["--tensor-model-parallel-size", "2", "--sequence-parallel",
            "--expert-model-parallel-size", "2"], 2,
     "world size 2 is not divisible by --expert-tensor-parallel-size (2) x "
     "--expert-model-parallel-size (2) x --pipeline-model-parallel-size (1)"),
    (MOE + ["--pipeline-model-parallel-size", "2"], 2,
     "--moe-token-dispatcher-type allgather does not take micro-batches of varying length"),
    (MOE + ["--moe-grouped-gemm", "--transformer-impl", "local"], 1,
     "--moe-grouped-gemm is Transformer Engine's grouped GEMM: it needs --transformer-impl "
     "transformer_engine"),
    (MOE + ["--moe-ffn-hidden-size", "33", "--tensor-model-parallel-size", "2",
            "--sequence-parallel"], 2,
     "--moe-ffn-hidden-size (33) is not divisible by --expert-tensor-parallel-size (2)"),
    (MOE + ["--fp8-emulation", "--transformer-impl", "local"], 1,
     "--num-experts does not combine with FP8 yet"),
])
def test_bad_moe_flags_name_the_flag(argv, world, message):
    with pytest.raises(ConfigError) as error:
        read_args(argv, world_size=world)
    assert message in str(error.value)


def test_the_run_schedule_has_the_expert_all_to_alls():
    """The bubble schedule the run executes (PP=2, EP=2) has the expert all-to-alls of
    the chunk with MoE layers (layers 0-1 on chunk 0; chunk 1 dense) after its actions."""
    import megatron_mm.prepared  # noqa: F401  (the planning package needs the CPU patches)
    from megatron_mm.training.planning.chain import training_chain
    from megatron_mm.training.planning.encoder_schedule import (encoder_pipeline_plan,
                                                                make_schedule)

    args = read_args(["--num-layers", "4", "--num-experts", "4", "--moe-layer-freq",
                      "[1,1,0,0]", "--moe-token-dispatcher-type", "alltoall",
                      "--expert-model-parallel-size", "2", "--pipeline-model-parallel-size",
                      "2", "--encoder-schedule", "bubble", "--global-batch-size", "8",
                      "--micro-batch-size", "2"], world_size=4)
    args.model_config.language.vocab_size = 64
    config = RunConfig.from_flags(args)
    chain = training_chain(config)
    plan = encoder_pipeline_plan(config, chain)
    assert plan.llm_partition.layers_per_chunk == [3, 3]  # [embedding, 0, 1] [2, 3, head]
    schedule = make_schedule(config, plan, 4, chain)
    assert schedule.expert_chunks == [0]
    order = [a.key for a in schedule.ranks[0]]
    for m in range(4):
        assert order[order.index(("F", m, 0)) + 1] == ("A2A", m, 0)
        assert order[order.index(("B", m, 0)) + 1] == ("A2A_B", m, 0)
    assert not any(a.kind.expert for a in schedule.ranks[1])


def test_expert_tensor_parallelism_with_ep_on_gloo_names_the_flag():
    """ETP 2 x EP 2: the all-to-all dispatcher's uneven all-gathers, which gloo refuses
    mid-run, are refused before the model is built; ETP 1 builds."""
    from megatron_mm.training.assembly.build_settings import build_settings
    from megatron_mm.training.cli.arguments import parse_run_config

    argv = MOE + ["--tensor-model-parallel-size", "2", "--sequence-parallel",
                  "--expert-model-parallel-size", "2", "--moe-token-dispatcher-type",
                  "alltoall", "--distributed-backend", "gloo"]
    with pytest.raises(ConfigError) as error:
        build_settings(parse_run_config(argv, world_size=4))
    assert "--expert-tensor-parallel-size 2 with --expert-model-parallel-size 2" in str(
        error.value)
    assert "pass --expert-tensor-parallel-size 1" in str(error.value)
    settings = build_settings(parse_run_config(
        argv + ["--expert-tensor-parallel-size", "1"], world_size=4))
    assert settings.expert_tensor_parallel_size == 1
