"""Layer specs are chosen in one place: local without TE/CUDA, a clear error if TE is asked."""

import pytest

import megatron_mm.models  # noqa: F401  (CPU patches first)
from megatron_mm.config import ConfigError
from megatron_mm.models.specs import default_transformer_impl, get_layer_specs


def test_local_specs_without_transformer_engine():
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear

    assert default_transformer_impl() == "local"
    specs = get_layer_specs("local", qk_layernorm=True)
    assert specs.projector.linear_fc1 is ColumnParallelLinear
    attention = specs.language_layer.submodules.self_attention.submodules
    assert attention.q_layernorm is not None and attention.linear_qkv is ColumnParallelLinear


def test_transformer_engine_requested_without_it():
    with pytest.raises(ConfigError, match="--transformer-impl local"):
        get_layer_specs("transformer_engine")
    with pytest.raises(ConfigError, match="--transformer-impl must be one of"):
        get_layer_specs("apex")


def test_context_parallel_swaps_only_the_llm_core_attention():
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    from megatron_mm.models.cp_attention import ContextParallelAttention

    plain = get_layer_specs("local")
    cp = get_layer_specs("local", context_parallel=True)
    core = lambda s: s.submodules.self_attention.submodules.core_attention  # noqa: E731
    assert core(cp.language_layer) is ContextParallelAttention
    assert core(plain.language_layer) is DotProductAttention  # the shared spec is untouched
    assert core(cp.vision_layer) is core(plain.vision_layer)
