"""LlamaForCausalLM for the converter: the shared LLM table, layout and flags."""

from ...hf.families import causal_lm

ARCHITECTURES = causal_lm("Llama")
