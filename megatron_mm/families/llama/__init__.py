"""Llama: a decoder-only LLM (Megatron-Core's GPTModel); it converts as
``LlamaForCausalLM``."""

from ..record import Family

FAMILY = Family("llama", text_models=("llama",),
                architectures=("LlamaForCausalLM",),
                conversion="megatron_mm.families.llama.hf")
