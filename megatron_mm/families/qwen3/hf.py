"""Qwen3ForCausalLM for the converter: the shared LLM table, layout and flags."""

from ...hf.families import TextModel, causal_lm

ARCHITECTURES = causal_lm("Qwen3")
TEXT_MODELS = {"qwen3": TextModel(flags=("qk_layernorm",))}
