"""The local specs' norm runs under sequence parallelism and marks its weights for
Megatron-Core's gradient all-reduce over the TP group (as its TE and Apex norms do), where
Megatron-Core's own torch norm refuses; every norm slot of the local specs uses it."""

import pytest
import torch

from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron_mm.models.norms import SequenceParallelNorm
from megatron_mm.models.specs import get_layer_specs


def _config(normalization: str, sequence_parallel: bool) -> TransformerConfig:
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2,
                               normalization=normalization)
    config.sequence_parallel = sequence_parallel  # TP=1 here: set after validation
    return config


@pytest.mark.parametrize("normalization, cls", [("LayerNorm", torch.nn.LayerNorm),
                                                ("RMSNorm", torch.nn.RMSNorm)])
def test_norm_marks_its_weights(normalization, cls):
    for sp in (True, False):
        norm = SequenceParallelNorm(_config(normalization, sp), 8, eps=1e-5)
        assert type(norm) is cls and norm.eps == 1e-5
        params = list(norm.parameters())
        assert params and all(p.sequence_parallel is sp for p in params)
    with pytest.raises(AssertionError, match="sequence parallel not supported"):
        WrappedTorchNorm(_config(normalization, True), 8)


def test_local_specs_use_it_everywhere():
    specs = get_layer_specs("local", qk_layernorm=True)
    assert specs.vision_norm is SequenceParallelNorm
    for layer in (specs.vision_layer, specs.language_layer):
        sub = layer.submodules
        assert sub.input_layernorm is SequenceParallelNorm
        assert sub.pre_mlp_layernorm is SequenceParallelNorm
    attention = specs.language_layer.submodules.self_attention.submodules
    assert attention.q_layernorm is attention.k_layernorm is SequenceParallelNorm
