"""The weight tables: Megatron-Core names (left) from Hugging Face names (right).

Each table is written relative to its submodule; ``prefixed`` places it in a model.
"""

from __future__ import annotations

from .mapping import Rule, prefixed
from .transforms import CLASS_TOKEN, GATE_UP, VOCAB, QKVBiasWithoutKey, QKVPerGroup

_LAYER = "decoder.layers.{i}."
_QKV_LM = QKVPerGroup("language")
_QKV_VIT = QKVPerGroup("vision")

# Llama / Mistral / Qwen2 / Qwen3 decoder (GPTModel <- LlamaModel and relatives).
LANGUAGE = (
    Rule("embedding.word_embeddings.weight", ("embed_tokens.weight",), VOCAB),
    Rule(_LAYER + "input_layernorm.weight", ("layers.{i}.input_layernorm.weight",)),
    *(Rule(_LAYER + f"self_attention.linear_qkv.{p}",
           tuple(f"layers.{{i}}.self_attn.{x}_proj.{p}" for x in "qkv"), _QKV_LM)
      for p in ("weight", "bias")),
    Rule(_LAYER + "self_attention.q_layernorm.weight", ("layers.{i}.self_attn.q_norm.weight",)),
    Rule(_LAYER + "self_attention.k_layernorm.weight", ("layers.{i}.self_attn.k_norm.weight",)),
    Rule(_LAYER + "self_attention.linear_proj.weight", ("layers.{i}.self_attn.o_proj.weight",)),
    Rule(_LAYER + "pre_mlp_layernorm.weight", ("layers.{i}.post_attention_layernorm.weight",)),
    Rule(_LAYER + "mlp.linear_fc1.weight",
         ("layers.{i}.mlp.gate_proj.weight", "layers.{i}.mlp.up_proj.weight"), GATE_UP),
    Rule(_LAYER + "mlp.linear_fc2.weight", ("layers.{i}.mlp.down_proj.weight",)),
    Rule("decoder.final_layernorm.weight", ("norm.weight",)),
)
# The untied output layer sits outside the decoder module in Hugging Face models.
OUTPUT_LAYER = (Rule("output_layer.weight", ("lm_head.weight",), VOCAB),)

# CLIP and SigLIP towers (VisionTransformer <- CLIPVisionModel / SiglipVisionModel).
VISION = (
    Rule("class_token", ("embeddings.class_embedding",), CLASS_TOKEN),
    Rule("conv1.weight", ("embeddings.patch_embedding.weight",)),
    Rule("conv1.bias", ("embeddings.patch_embedding.bias",)),
    Rule("position_embeddings.weight", ("embeddings.position_embedding.weight",)),
    *(Rule(f"ln_pre.{p}", (f"pre_layrnorm.{p}",)) for p in ("weight", "bias")),
    *(Rule(f"ln_post.{p}", (f"post_layernorm.{p}",)) for p in ("weight", "bias")),
    *(r for p in ("weight", "bias") for r in (
        Rule(_LAYER + f"input_layernorm.{p}", (f"encoder.layers.{{i}}.layer_norm1.{p}",)),
        Rule(_LAYER + f"self_attention.linear_qkv.{p}",
             tuple(f"encoder.layers.{{i}}.self_attn.{x}_proj.{p}" for x in "qkv"), _QKV_VIT),
        Rule(_LAYER + f"self_attention.linear_proj.{p}",
             (f"encoder.layers.{{i}}.self_attn.out_proj.{p}",)),
        Rule(_LAYER + f"pre_mlp_layernorm.{p}", (f"encoder.layers.{{i}}.layer_norm2.{p}",)),
        Rule(_LAYER + f"mlp.linear_fc1.{p}", (f"encoder.layers.{{i}}.mlp.fc1.{p}",)),
        Rule(_LAYER + f"mlp.linear_fc2.{p}", (f"encoder.layers.{{i}}.mlp.fc2.{p}",)),
    )),
)

# Whisper / Qwen2-Audio encoders (AudioEncoder <- WhisperEncoder / Qwen2AudioEncoder).
_QKV_AUDIO = QKVPerGroup("audio")
AUDIO = (
    *(Rule(f"conv{n}.{p}", (f"conv{n}.{p}",)) for n in (1, 2) for p in ("weight", "bias")),
    Rule("position_embeddings", ("embed_positions.weight",)),
    *(Rule(f"ln_post.{p}", (f"layer_norm.{p}",)) for p in ("weight", "bias")),
    Rule(_LAYER + "self_attention.linear_qkv.weight",
         tuple(f"layers.{{i}}.self_attn.{x}_proj.weight" for x in "qkv"), _QKV_AUDIO),
    Rule(_LAYER + "self_attention.linear_qkv.bias",
         ("layers.{i}.self_attn.q_proj.bias", "layers.{i}.self_attn.v_proj.bias"),
         QKVBiasWithoutKey("audio")),
    *(r for p in ("weight", "bias") for r in (
        Rule(_LAYER + f"input_layernorm.{p}", (f"layers.{{i}}.self_attn_layer_norm.{p}",)),
        Rule(_LAYER + f"self_attention.linear_proj.{p}",
             (f"layers.{{i}}.self_attn.out_proj.{p}",)),
        Rule(_LAYER + f"pre_mlp_layernorm.{p}", (f"layers.{{i}}.final_layer_norm.{p}",)),
        Rule(_LAYER + f"mlp.linear_fc1.{p}", (f"layers.{{i}}.fc1.{p}",)),
        Rule(_LAYER + f"mlp.linear_fc2.{p}", (f"layers.{{i}}.fc2.{p}",)),
    )),
)
# Qwen2-Audio's projector: one Linear (MultimodalProjector "affine").
AFFINE_PROJECTOR = tuple(Rule(f"encoder.{p}", (f"linear.{p}",)) for p in ("weight", "bias"))

# LLaVA's MLP projector (MultimodalProjector <- LlavaMultiModalProjector).
PROJECTOR = tuple(Rule(f"encoder.linear_fc{n}.{p}", (f"linear_{n}.{p}",))
                  for n in (1, 2) for p in ("weight", "bias"))


def causal_lm_rules():
    return (prefixed(LANGUAGE, "language_model.", "model.")
            + prefixed(OUTPUT_LAYER, "language_model.", ""))


def llava_rules():
    return (prefixed(LANGUAGE, "language_model.", "model.language_model.")
            + prefixed(OUTPUT_LAYER, "language_model.", "")
            + prefixed(VISION, "vision_model.", "model.vision_tower.")
            + prefixed(PROJECTOR, "vision_projection.", "model.multi_modal_projector."))


def qwen2_audio_rules():
    return (prefixed(LANGUAGE, "language_model.", "model.language_model.")
            + prefixed(OUTPUT_LAYER, "language_model.", "")
            + prefixed(AUDIO, "audio_model.", "model.audio_tower.")
            + prefixed(AFFINE_PROJECTOR, "audio_projection.", "model.multi_modal_projector."))
