"""MistralForCausalLM for the converter: the shared LLM table, layout and flags."""

from ...hf.families import TextModel, causal_lm

ARCHITECTURES = causal_lm("Mistral")
# Mistral windows every layer (its config has no layer_types).
TEXT_MODELS = {"mistral": TextModel(windows_every_layer=True)}
