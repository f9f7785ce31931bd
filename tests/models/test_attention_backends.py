"""The start-up log's attention backend of each model part: what the local layers compute,
and Transformer Engine's own choice (its ``get_attention_backend``) for each TE module's
shapes. TE is faked: its ``AttentionParams`` / ``get_attention_backend`` module and a
``DotProductAttention`` subclass carrying the attributes TE's sets."""

import dataclasses
import sys
from typing import Optional, Tuple

import pytest
import torch

from megatron_mm.config import LanguageModelConfig, MultimodalModelConfig
from megatron_mm.families.vit.config import VisionEncoderConfig
from megatron_mm.models import attention_backends
from megatron_mm.models.attention_backends import (
    attention_backend_lines,
    describe_attention_backends,
    te_backend,
)

LOCAL = "local (Megatron-Core DotProductAttention, unfused: baddbmm, torch softmax, bmm)"


def _model():
    from megatron_mm.models import BuildSettings, build_model

    cfg = MultimodalModelConfig(
        encoders={"vision": VisionEncoderConfig(hidden_size=32, num_layers=1,
                                                num_attention_heads=2, img_h=16, img_w=16,
                                                patch_dim=4)},
        language=LanguageModelConfig(vocab_size=256, hidden_size=64, num_attention_heads=4,
                                     num_query_groups=2))
    return build_model(cfg, BuildSettings(), {"image": 250})


@dataclasses.dataclass(eq=True)
class FakeAttentionParams:  # a subset of TE's fields, and one this code never fills
    qkv_dtype: torch.dtype = torch.bfloat16
    qkv_layout: str = "sbh3d"
    batch_size: int = 1
    num_heads: int = 16
    num_gqa_groups: int = 16
    max_seqlen_q: int = 128
    max_seqlen_kv: int = 128
    head_dim_qk: int = 64
    attn_mask_type: str = "no_mask"
    window_size: Optional[Tuple[int, int]] = None
    deterministic: bool = False
    is_training: bool = True
    return_max_logit: bool = False


class FakeTE:
    """TE's utils module: flash for bf16, unfused for fp32 (TE's rule: no fused or flash
    kernel in fp32); records the params it was asked about."""

    AttentionParams = FakeAttentionParams

    def __init__(self):
        self.asked = []

    def get_attention_backend(self, params):
        self.asked.append(params)
        bf16 = params.qkv_dtype == torch.bfloat16
        return bf16, "2.7.4" if bf16 else None, False, None, not bf16, [bf16, False, True]


def fake_te_attention(mask="causal"):
    cls = type("DotProductAttention", (torch.nn.Module,), {
        "__module__": "transformer_engine.pytorch.attention.dot_product_attention."
                      "dot_product_attention"})
    sub = type("TEDotProductAttention", (cls,), {"__module__": "megatron.core.extensions"})
    module = sub()
    module.__dict__.update(
        qkv_format="sbhd", attn_mask_type=mask, tp_size=2, num_attention_heads=8,
        num_gqa_groups_per_partition=2, hidden_size_per_attention_head_k=32,
        hidden_size_per_attention_head_v=32, attention_dropout=0.0, deterministic=False,
        window_size=(-1, 0), cp_group=None, softmax_type="vanilla")
    return module


@pytest.fixture
def fake_te(monkeypatch):
    te = FakeTE()
    monkeypatch.setitem(sys.modules, attention_backends._TE_UTILS, te)
    return te


def test_local_layers_say_what_they_compute(gloo_world):
    found = describe_attention_backends([_model()], 2, 64, torch.float32)
    assert found == {"llm": [LOCAL], "vision": [LOCAL]}


def test_te_backend_is_tes_own_choice(fake_te):
    module = fake_te_attention()
    assert attention_backends.is_te_attention(module)
    assert te_backend(module, torch.bfloat16, 2, 64) == (
        "transformer_engine FlashAttention 2.7.4 (causal mask, sbhd_sbhd_sbhd)")
    asked = fake_te.asked[-1]
    assert (asked.num_heads, asked.num_gqa_groups, asked.head_dim_qk) == (4, 2, 32)
    assert (asked.batch_size, asked.max_seqlen_q, asked.max_seqlen_kv) == (2, 64, 64)
    assert asked.window_size == (-1, 0) and asked.is_training
    assert te_backend(fake_te_attention("padding"), torch.float32, 2, 18) == (
        "transformer_engine UnfusedDotProductAttention (padding mask, sbhd_sbhd_sbhd)")


def test_each_part_and_rank_zero_lines(gloo_world, fake_te):
    """A TE attention in the LLM is reported under "llm" with the LLM's sequence length;
    the ViT's keeps its own (its layers' sequence)."""
    model = _model()
    for layer in model.language_model.decoder.layers:
        layer.self_attention.core_attention = fake_te_attention()
    lines = attention_backend_lines([model], 2, 64, torch.bfloat16)
    assert lines == ["llm: transformer_engine FlashAttention 2.7.4 (causal mask, "
                     "sbhd_sbhd_sbhd)", f"vision: {LOCAL}"]
    assert fake_te.asked[-1].max_seqlen_q == 64


def test_no_te_utils_is_said(monkeypatch):
    monkeypatch.setitem(sys.modules, attention_backends._TE_UTILS, None)  # import fails
    assert te_backend(fake_te_attention(), torch.bfloat16, 1, 8).startswith(
        "transformer_engine (backend not known")

