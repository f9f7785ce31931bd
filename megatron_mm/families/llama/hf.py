"""LlamaForCausalLM for the converter: the shared LLM table, layout and flags."""

from ...hf.families import TextModel, causal_lm

ARCHITECTURES = causal_lm("Llama")
TEXT_MODELS = {"llama": TextModel()}
