"""Qwen3-MoE: a decoder-only LLM whose MLPs are mixtures of experts (Megatron-Core's
GPTModel with MoE layers); it converts as ``Qwen3MoeForCausalLM``."""

from ..record import Family

FAMILY = Family("qwen3_moe", text_models=("qwen3_moe",),
                architectures=("Qwen3MoeForCausalLM",),
                conversion="megatron_mm.families.qwen3_moe.hf")
