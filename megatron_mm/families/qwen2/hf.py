"""Qwen2ForCausalLM for the converter: the shared LLM table, layout and flags."""

from ...hf.families import TextModel, causal_lm

ARCHITECTURES = causal_lm("Qwen2")
# Qwen2's q/k/v biases are its architecture.
TEXT_MODELS = {"qwen2": TextModel(flags=("add_qkv_bias",))}
