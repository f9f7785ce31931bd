"""Qwen3.5-MoE: Qwen3.5's tower and hybrid LLM (``families/qwen3_5``) with every layer's MLP
a Megatron-Core ``MoELayer``: softmax top-k routing renormalised over the top-k, and a
shared expert under a sigmoid gate; converts as ``Qwen3_5MoeForConditionalGeneration``."""

from ..record import Family

FAMILY = Family("qwen3_5_moe", architectures=("Qwen3_5MoeForConditionalGeneration",),
                text_models=("qwen3_5_moe_text",),
                conversion="megatron_mm.families.qwen3_5_moe.hf")
