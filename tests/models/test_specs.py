"""Layer specs are chosen in one place: local without TE/CUDA, a clear error if TE is asked."""

import pytest

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


def _mask_type(specs):
    return specs.language_layer.submodules.self_attention.params["attn_mask_type"]


def test_a_non_causal_mask_on_te_declares_arbitrary(te_placeholder_specs):
    """TE's causal attention ignores the mask it is given: --media-attention bidirectional
    must declare a mask type TE applies (local attention applies any mask it gets)."""
    from megatron.core.transformer.enums import AttnMaskType

    from megatron_mm.models.te_attention_mask import language_attn_mask_type

    te = te_placeholder_specs
    assert _mask_type(te("transformer_engine")) == AttnMaskType.causal
    bidirectional = te("transformer_engine", media_attention="bidirectional")
    assert _mask_type(bidirectional) == AttnMaskType.arbitrary
    assert _mask_type(te("transformer_engine")) == AttnMaskType.causal  # spec not mutated
    # The encoders attend everything (no mask) either way.
    vit = bidirectional.vision_layer.submodules.self_attention.params["attn_mask_type"]
    assert vit == AttnMaskType.no_mask
    # With CP our ContextParallelAttention applies the mask itself.
    assert language_attn_mask_type("transformer_engine", "bidirectional",
                                   context_parallel=True) == AttnMaskType.causal
    assert _mask_type(get_layer_specs("local", media_attention="bidirectional")) == \
        AttnMaskType.causal
