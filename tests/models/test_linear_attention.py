"""Megatron-Core's Gated DeltaNet layer as the hybrid LLM builds it (``SampleIsolatedGDN``
from ``gdn_attention_spec``): two samples packed in one row (their ``PackedSequences``
carrier, as ``training/attention.py`` makes it) give each sample's output of running it
alone, and its gradients; without the carrier the second sample's output changes (the
state crossed the boundary), so the check can fail. A GPU without flash-linear-attention
is refused by name."""

import pytest
import torch
import torch.nn.functional as F

from megatron_mm.config import ConfigError

HIDDEN, LENGTHS = 32, (21, 70)  # the second sample spans two chunks of 64


def _gdn():
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron_mm.models.linear_attention import gdn_attention_spec

    config = TransformerConfig(
        num_layers=1, hidden_size=HIDDEN, num_attention_heads=4, normalization="RMSNorm",
        experimental_attention_variant="gated_delta_net", linear_attention_freq=[1],
        linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8,
        linear_num_key_heads=2, linear_num_value_heads=4, activation_func=F.silu,
        use_cpu_initialization=True, layernorm_zero_centered_gamma=True)
    torch.manual_seed(0)
    gdn = build_module(gdn_attention_spec("local"), config=config, layer_number=1,
                       pg_collection=ProcessGroupCollection.use_mpu_process_groups())
    with torch.no_grad():  # decays and gates spread out, a plain (not 1 + w) output norm
        gdn.A_log.uniform_(-2.0, 0.5)
        gdn.dt_bias.normal_()
        gdn.out_norm.weight.normal_(1.0, 0.3)
    return gdn


def test_packed_samples_equal_separate_ones(gloo_world):
    from megatron_mm.models.packed_sequences import packed_sequences

    gdn = _gdn()
    assert type(gdn.out_norm) is torch.nn.RMSNorm  # not zero-centred like the LLM's norms
    x = torch.randn(sum(LENGTHS), 1, HIDDEN, generator=torch.Generator().manual_seed(1),
                    requires_grad=True)
    cu = torch.tensor([0, LENGTHS[0], sum(LENGTHS)], dtype=torch.int32)
    packed, _ = gdn(x, None, packed_seq_params=packed_sequences(cu))
    packed.square().sum().backward()
    grads = {n: p.grad.clone() for n, p in gdn.named_parameters()}
    gdn.zero_grad()
    alone = []
    for piece in x.detach().split(LENGTHS):
        out, _ = gdn(piece, None)
        out.square().sum().backward()
        alone.append(out)
    torch.testing.assert_close(packed, torch.cat(alone), rtol=1e-5, atol=1e-6)
    for name, param in gdn.named_parameters():
        torch.testing.assert_close(grads[name], param.grad, rtol=1e-4, atol=1e-6,
                                   msg=lambda m: f"{name}: {m}")
    leaked, _ = gdn(x.detach(), None)  # no carrier: one sequence, the state carries over
    assert (leaked[LENGTHS[0]:] - alone[1]).abs().max() > 1e-3


def test_gpu_without_fla_is_refused(monkeypatch):
    from megatron.core.ssm.gated_delta_net import common

    from megatron_mm.models.linear_attention import require_fla

    monkeypatch.setattr(common, "HAVE_FLA", False)  # upstream's value without FLA
    with pytest.raises(ConfigError, match="need flash-linear-attention on CUDA: pip install "
                                          "flash-linear-attention"):
        require_fla(cuda=True)
    require_fla(cuda=False)  # the CPU stand-ins run


def test_packed_row_through_the_model_equals_separate_samples(gloo_world):
    """The whole path: ``AttentionSettings.mask_for`` of a packed batch (the local impl)
    gives the model a carrier with the dense mask; the hybrid LLM's logits on the packed
    row equal each sample's alone (GDN layer 0, full attention layer 1, GDN layer 2).
    Without the carrier the GDN state crosses the boundary: 65% of the logits move."""
    from megatron_mm.config import (LanguageModelConfig, LinearAttentionConfig,
                                    MultimodalModelConfig)
    from megatron_mm.models import BuildSettings, build_model
    from megatron_mm.models.packed_sequences import PackedSequences
    from megatron_mm.training.assembly.attention import AttentionSettings

    lm = LanguageModelConfig(
        vocab_size=128, hidden_size=HIDDEN, num_layers=3, num_attention_heads=4,
        kv_channels=16, ffn_hidden_size=64, seq_length=128, qk_layernorm=True,
        rotary_percent=0.25, attention_output_gate=True, apply_layernorm_1p=True,
        linear_attention=LinearAttentionConfig(
            linear_attention_freq=(1, 0, 1), linear_key_head_dim=8, linear_value_head_dim=8,
            linear_num_key_heads=2, linear_num_value_heads=4))
    torch.manual_seed(0)
    model = build_model(MultimodalModelConfig(encoders={}, projectors={}, language=lm),
                        BuildSettings(), {}).eval()
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 128, (1, sum(LENGTHS)), generator=gen)
    positions = torch.cat([torch.arange(n) for n in LENGTHS])[None]
    cu = torch.tensor([0, LENGTHS[0], sum(LENGTHS)], dtype=torch.int32)
    mask = AttentionSettings({}, linear_attention=True).mask_for(
        {"tokens": tokens, "cu_seqlens": cu})
    assert isinstance(mask, PackedSequences) and mask.mask is not None
    with torch.no_grad():
        packed = model(tokens, positions, attention_mask=mask)
        alone = [model(t, p) for t, p in zip(tokens.split(LENGTHS, 1),
                                              positions.split(LENGTHS, 1))]
    torch.testing.assert_close(packed, torch.cat(alone, 1), rtol=1e-4, atol=1e-5)
