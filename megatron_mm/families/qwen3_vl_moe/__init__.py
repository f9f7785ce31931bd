"""Qwen3-VL-MoE: Qwen3-VL's vision encoder (DeepStack) in front of a Qwen3-MoE LLM with
interleaved M-RoPE; it trains on the qwen3_vl encoder and Megatron-Core's MoE layers and
converts as ``Qwen3VLMoeForConditionalGeneration``."""

from ..record import Family

FAMILY = Family("qwen3_vl_moe", architectures=("Qwen3VLMoeForConditionalGeneration",),
                text_models=("qwen3_vl_moe_text",),
                conversion="megatron_mm.families.qwen3_vl_moe.hf")
