"""The weight tables: Megatron-Core names (left) from Hugging Face names (right).

Each table is written relative to its submodule; ``prefixed`` places it in a model.
"""

from __future__ import annotations

from .mapping import Rule, prefixed
from .transforms import GATE_UP, VOCAB, QKVPerGroup

LAYER = "decoder.layers.{i}."  # a Megatron-Core layer's prefix
_QKV_LM = QKVPerGroup("language")

# Llama / Mistral / Qwen2 / Qwen3 decoder (GPTModel <- LlamaModel and relatives).
LANGUAGE = (
    Rule("embedding.word_embeddings.weight", ("embed_tokens.weight",), VOCAB),
    Rule(LAYER + "input_layernorm.weight", ("layers.{i}.input_layernorm.weight",)),
    *(Rule(LAYER + f"self_attention.linear_qkv.{p}",
           tuple(f"layers.{{i}}.self_attn.{x}_proj.{p}" for x in "qkv"), _QKV_LM)
      for p in ("weight", "bias")),
    Rule(LAYER + "self_attention.q_layernorm.weight", ("layers.{i}.self_attn.q_norm.weight",)),
    Rule(LAYER + "self_attention.k_layernorm.weight", ("layers.{i}.self_attn.k_norm.weight",)),
    Rule(LAYER + "self_attention.linear_proj.weight", ("layers.{i}.self_attn.o_proj.weight",)),
    Rule(LAYER + "pre_mlp_layernorm.weight", ("layers.{i}.post_attention_layernorm.weight",)),
    Rule(LAYER + "mlp.linear_fc1.weight",
         ("layers.{i}.mlp.gate_proj.weight", "layers.{i}.mlp.up_proj.weight"), GATE_UP),
    Rule(LAYER + "mlp.linear_fc2.weight", ("layers.{i}.mlp.down_proj.weight",)),
    Rule("decoder.final_layernorm.weight", ("norm.weight",)),
)
# The untied output layer sits outside the decoder module in Hugging Face models.
OUTPUT_LAYER = (Rule("output_layer.weight", ("lm_head.weight",), VOCAB),)

def causal_lm_rules():
    return (prefixed(LANGUAGE, "language_model.", "model.")
            + prefixed(OUTPUT_LAYER, "language_model.", ""))
