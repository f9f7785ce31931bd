"""A tiny CLIP-style ViT -> MLP projector -> LLM config and model, for the FP8 tests that
build one in process (16 image tokens per 16 px image; media token id 250)."""

from __future__ import annotations

from typing import Optional

import torch

MEDIA_ID = 250


def tiny_config(vit_layers: int = 2, llm_layers: int = 2, seq_length: Optional[int] = None,
                vit_type: str = "clip"):
    from megatron_mm.config import LanguageModelConfig, MultimodalModelConfig
    from megatron_mm.families.vit.config import VisionEncoderConfig

    language = dict(vocab_size=256, hidden_size=64, num_layers=llm_layers,
                    num_attention_heads=4, num_query_groups=2)
    if seq_length is not None:
        language["seq_length"] = seq_length
    return MultimodalModelConfig(
        encoders={"vision": VisionEncoderConfig(model_type=vit_type, hidden_size=32,
                                                num_layers=vit_layers,
                                                num_attention_heads=2, img_h=16, img_w=16,
                                                patch_dim=4, drop_class_token=True)},
        language=LanguageModelConfig(**language))


def tiny_model(fp8=None, bf16: bool = False, **sizes):
    """``tiny_config(**sizes)`` built with ``fp8`` (``Fp8Settings`` or None), seed 0."""
    from megatron_mm.models import BuildSettings, build_model

    torch.manual_seed(0)
    return build_model(tiny_config(**sizes), BuildSettings(fp8=fp8, bf16=bf16),
                       {"image": MEDIA_ID})
