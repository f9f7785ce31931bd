"""Qwen2: a decoder-only LLM (Megatron-Core's GPTModel); it converts as
``Qwen2ForCausalLM``."""

from ..record import Family

FAMILY = Family("qwen2", text_models=("qwen2",),
                architectures=("Qwen2ForCausalLM",),
                conversion="megatron_mm.families.qwen2.hf")
