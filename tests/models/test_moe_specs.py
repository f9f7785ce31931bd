"""The LLM's MoE layer specs: Megatron-Core's MoELayer with our router, the same checkpoint
names with the local and the TE spec, context-parallel attention and mask type as the
dense layers', no silent grouped GEMM without TE, and each chunk's dense and MoE layers by
the --moe-layer-freq pattern."""

import pytest

from megatron_mm.config import ConfigError
from megatron_mm.models.moe_router import SequenceScaledRouter
from megatron_mm.models.specs import get_layer_specs


def _router(layer):
    return layer.submodules.mlp.keywords["submodules"].router


def test_local_moe_layer():
    from megatron.core.transformer.moe.experts import SequentialMLP
    from megatron.core.transformer.moe.moe_layer import MoELayer

    from megatron_mm.models.cp_attention import ContextParallelAttention
    from megatron_mm.models.norms import SequenceParallelNorm

    specs = get_layer_specs("local", qk_layernorm=True, context_parallel=True, num_experts=4)
    moe, dense = specs.language_moe_layer, specs.language_layer
    assert moe.submodules.mlp.func is MoELayer and _router(moe) is SequenceScaledRouter
    assert moe.submodules.mlp.keywords["submodules"].experts.func is SequentialMLP
    assert moe.submodules.pre_mlp_layernorm is SequenceParallelNorm
    core = moe.submodules.self_attention.submodules.core_attention
    assert core is ContextParallelAttention  # as the dense layers'
    # The pre-MLP norm keeps its own checkpoint name (TE's MoE layer has no fused one).
    assert "pre_mlp_layernorm." not in moe.submodules.sharded_state_dict_keys_map
    assert "pre_mlp_layernorm." in dense.submodules.sharded_state_dict_keys_map
    assert get_layer_specs("local").language_moe_layer is None


def test_transformer_engine_moe_layer_names(te_placeholder_specs):
    specs = te_placeholder_specs("transformer_engine", num_experts=4, moe_grouped_gemm=True)
    moe = specs.language_moe_layer
    assert _router(moe) is SequenceScaledRouter
    assert moe.submodules.pre_mlp_layernorm is not None  # a norm of its own: no renaming
    assert not any(k.startswith("pre_mlp_layernorm")
                   for k in moe.submodules.sharded_state_dict_keys_map)


def test_grouped_gemm_needs_transformer_engine():
    with pytest.raises(ConfigError, match="--moe-grouped-gemm needs --transformer-impl "
                                          "transformer_engine"):
        get_layer_specs("local", num_experts=4, moe_grouped_gemm=True)


def test_block_follows_the_layer_pattern(gloo_world):
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron_mm.models.build import language_block

    specs = get_layer_specs("local", num_experts=4)
    config = TransformerConfig(num_layers=4, hidden_size=16, num_attention_heads=2,
                               num_moe_experts=4, moe_layer_freq=[0, 1, 1, 0],
                               moe_ffn_hidden_size=8, add_bias_linear=False)
    layers = language_block(specs, config, None).layer_specs
    assert [layer is specs.language_moe_layer for layer in layers] == [False, True, True,
                                                                        False]
