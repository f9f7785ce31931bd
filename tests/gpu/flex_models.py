"""The tiny SigLIP + MLP + LLM config the FlexAttention GPU tests train (plain and LoRA)."""

from megatron_mm.config import (LanguageModelConfig, LoraConfig, MultimodalModelConfig,
                                ProjectorConfig)
from megatron_mm.families.vit.config import VisionEncoderConfig


def flex_test_config(seq_length: int, lora: LoraConfig | None = None) -> MultimodalModelConfig:
    return MultimodalModelConfig(
        encoders={"vision": VisionEncoderConfig(model_type="siglip", hidden_size=64, num_layers=1,
                                                num_attention_heads=4, img_h=32, img_w=32,
                                                patch_dim=8)},
        projectors={"vision": ProjectorConfig("mlp")},
        language=LanguageModelConfig(vocab_size=256, hidden_size=128, num_layers=2,
                                     num_attention_heads=4, num_query_groups=2,
                                     seq_length=seq_length),
        lora=lora)
