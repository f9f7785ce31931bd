"""The Whisper encoder's and Qwen2-Audio's weight tables: Megatron-Core names (left) from
Hugging Face names (right)."""

from __future__ import annotations

from ...hf.mapping import Rule, prefixed
from ...hf.tables import LANGUAGE, LAYER, OUTPUT_LAYER
from ...hf.transforms import QKVBiasWithoutKey, QKVPerGroup

# Whisper / Qwen2-Audio encoders (AudioEncoder <- WhisperEncoder / Qwen2AudioEncoder).
_QKV_AUDIO = QKVPerGroup("audio")
AUDIO = (
    *(Rule(f"conv{n}.{p}", (f"conv{n}.{p}",)) for n in (1, 2) for p in ("weight", "bias")),
    Rule("position_embeddings", ("embed_positions.weight",)),
    *(Rule(f"ln_post.{p}", (f"layer_norm.{p}",)) for p in ("weight", "bias")),
    Rule(LAYER + "self_attention.linear_qkv.weight",
         tuple(f"layers.{{i}}.self_attn.{x}_proj.weight" for x in "qkv"), _QKV_AUDIO),
    Rule(LAYER + "self_attention.linear_qkv.bias",
         ("layers.{i}.self_attn.q_proj.bias", "layers.{i}.self_attn.v_proj.bias"),
         QKVBiasWithoutKey("audio")),
    *(r for p in ("weight", "bias") for r in (
        Rule(LAYER + f"input_layernorm.{p}", (f"layers.{{i}}.self_attn_layer_norm.{p}",)),
        Rule(LAYER + f"self_attention.linear_proj.{p}",
             (f"layers.{{i}}.self_attn.out_proj.{p}",)),
        Rule(LAYER + f"pre_mlp_layernorm.{p}", (f"layers.{{i}}.final_layer_norm.{p}",)),
        Rule(LAYER + f"mlp.linear_fc1.{p}", (f"layers.{{i}}.fc1.{p}",)),
        Rule(LAYER + f"mlp.linear_fc2.{p}", (f"layers.{{i}}.fc2.{p}",)),
    )),
)
# Qwen2-Audio's projector: one Linear (MultimodalProjector "affine").
AFFINE_PROJECTOR = tuple(Rule(f"encoder.{p}", (f"linear.{p}",)) for p in ("weight", "bias"))

def qwen2_audio_rules():
    return (prefixed(LANGUAGE, "language_model.", "model.language_model.")
            + prefixed(OUTPUT_LAYER, "language_model.", "")
            + prefixed(AUDIO, "audio_model.", "model.audio_tower.")
            + prefixed(AFFINE_PROJECTOR, "audio_projection.", "model.multi_modal_projector."))
