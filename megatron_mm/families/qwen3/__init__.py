"""Qwen3: a decoder-only LLM (Megatron-Core's GPTModel); it converts as
``Qwen3ForCausalLM``."""

from ..record import Family

FAMILY = Family("qwen3", text_models=("qwen3",),
                architectures=("Qwen3ForCausalLM",),
                conversion="megatron_mm.families.qwen3.hf")
