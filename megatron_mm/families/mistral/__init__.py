"""Mistral: a decoder-only LLM (Megatron-Core's GPTModel); it converts as
``MistralForCausalLM``."""

from ..record import Family

FAMILY = Family("mistral", text_models=("mistral",),
                architectures=("MistralForCausalLM",),
                conversion="megatron_mm.families.mistral.hf")
