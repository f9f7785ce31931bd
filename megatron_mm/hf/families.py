"""Supported Hugging Face architectures: how each one's config becomes megatron_mm's
command-line flags (so a converted checkpoint rebuilds through the ordinary ``--load``
path), which weight table and on-disk layout it uses.

The checks reject what the megatron_mm model cannot reproduce exactly, naming the
Hugging Face config field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Tuple

from .errors import ConversionError
from .layouts import CAUSAL_LM, LLAVA, QWEN2_AUDIO, Layout
from .tables import causal_lm_rules, llava_rules, qwen2_audio_rules

LANGUAGE_TYPES = ("llama", "mistral", "qwen2", "qwen3")
VISION_TYPES = {"clip_vision_model": "clip", "siglip_vision_model": "siglip"}
# Hugging Face activation of each tower type; megatron_mm's ViT has exactly these.
VISION_ACTIVATION = {"clip": "quick_gelu", "siglip": "gelu_pytorch_tanh"}


@dataclass(frozen=True)
class Family:
    architecture: str
    layout: Layout
    rules: Callable
    multimodal: bool
    # Hugging Face tensors the megatron_mm model has no use for (vision layers past the
    # feature layer, the towers' final norm and pooling head, OneVision's tiling newline):
    # kept verbatim next to the checkpoint so export restores them.
    unused: Tuple[str, ...] = ()
    # The keyword arguments of the Hugging Face forward the megatron_mm model reproduces
    # (``convert_hf.py compare --inputs``).
    inputs: Tuple[str, ...] = ("input_ids", "attention_mask")


_VISION_UNUSED = (r"model\.vision_tower\.encoder\.layers\.\d+\..*",
                  r"model\.vision_tower\.post_layernorm\..*", r"model\.vision_tower\.head\..*")

_IMAGE_INPUTS = ("input_ids", "attention_mask", "pixel_values")

FAMILIES = {f.architecture: f for f in (
    *(Family(f"{name}ForCausalLM", CAUSAL_LM, causal_lm_rules, False)
      for name in ("Llama", "Mistral", "Qwen2", "Qwen3")),
    Family("LlavaForConditionalGeneration", LLAVA, llava_rules, True, _VISION_UNUSED,
           _IMAGE_INPUTS),
    # Without any-resolution tiling: one image = one tile at the tower's resolution.
    Family("LlavaOnevisionForConditionalGeneration", LLAVA, llava_rules, True,
           _VISION_UNUSED + (r"model\.image_newline",), _IMAGE_INPUTS),
    # Whisper encoder (pooled by 2) + one Linear + Qwen2.
    Family("Qwen2AudioForConditionalGeneration", QWEN2_AUDIO, qwen2_audio_rules, True,
           inputs=("input_ids", "attention_mask", "input_features",
                   "feature_attention_mask")),
)}


def family_for(hf_config) -> Family:
    archs = list(getattr(hf_config, "architectures", None) or [])
    for arch in archs:
        if arch in FAMILIES:
            return FAMILIES[arch]
    raise ConversionError(
        f"unsupported architecture {archs or hf_config.model_type!r} (config.json "
        f"'architectures'); supported: {', '.join(sorted(FAMILIES))}")


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ConversionError(message)


def language_flags(text) -> List[str]:
    kind = text.model_type
    _need(kind in LANGUAGE_TYPES, f"unsupported language model type {kind!r}; supported: "
                                  f"{', '.join(LANGUAGE_TYPES)}")
    rope = dict(getattr(text, "rope_parameters", None) or {})
    _need(rope.get("rope_type", "default") == "default",
          f"rope_parameters.rope_type {rope.get('rope_type')!r} (RoPE scaling) is not "
          f"supported; only 'default'")
    _need(text.hidden_act == "silu", f"hidden_act {text.hidden_act!r}: only 'silu' (SwiGLU)")
    _need(not getattr(text, "mlp_bias", False), "mlp_bias=True is not supported")
    # Qwen2 has q/k/v biases by design; attention_bias elsewhere also biases o_proj.
    _need(not getattr(text, "attention_bias", False),
          "attention_bias=True (a bias on o_proj too) is not supported")
    _need(not getattr(text, "use_sliding_window", False),
          "use_sliding_window=True is not supported")
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    flags = ["--num-layers", text.num_hidden_layers, "--hidden-size", text.hidden_size,
             "--ffn-hidden-size", text.intermediate_size, "--num-attention-heads", heads,
             "--group-query-attention",
             "--num-query-groups", text.num_key_value_heads or heads,
             "--kv-channels", head_dim,
             "--max-position-embeddings", text.max_position_embeddings,
             "--rotary-base", rope.get("rope_theta", 10000.0),
             "--norm-epsilon", text.rms_norm_eps]
    if kind == "qwen2":
        flags.append("--add-qkv-bias")
    if kind == "qwen3":
        flags.append("--qk-layernorm")
    if not text.tie_word_embeddings:
        flags.append("--untie-embeddings-and-output-weights")
    return [str(f) for f in flags]


def vision_flags(hf_config) -> List[str]:
    vision, text = hf_config.vision_config, hf_config.get_text_config()
    kind = VISION_TYPES.get(vision.model_type)
    _need(kind is not None, f"unsupported vision tower {vision.model_type!r}; supported: "
                            f"{', '.join(VISION_TYPES)}")
    _need(vision.hidden_act == VISION_ACTIVATION[kind],
          f"vision_config.hidden_act {vision.hidden_act!r}: {kind} towers use "
          f"{VISION_ACTIVATION[kind]!r}")
    _need(getattr(vision, "num_channels", 3) == 3, "vision_config.num_channels must be 3")
    layer = hf_config.vision_feature_layer
    _need(isinstance(layer, int), f"vision_feature_layer {layer!r}: only a single layer "
                                  f"(an int) is supported")
    strategy = hf_config.vision_feature_select_strategy
    _need(strategy in ("default", "full"), f"vision_feature_select_strategy {strategy!r}")
    # "default" drops the first token: CLIP's class token, but a patch token of SigLIP.
    _need(kind == "clip" or strategy == "full",
          "vision_feature_select_strategy 'default' drops a SigLIP patch token, which "
          "megatron_mm does not reproduce; SigLIP checkpoints use 'full'")
    _need(hf_config.projector_hidden_act == "gelu",
          f"projector_hidden_act {hf_config.projector_hidden_act!r}: only 'gelu'")
    _need(getattr(hf_config, "multimodal_projector_bias", True),
          "multimodal_projector_bias=False is not supported")
    flags = ["--vision-model-type", kind, "--vision-hidden-size", vision.hidden_size,
             "--vision-num-layers", vision.num_hidden_layers,
             "--vision-num-attention-heads", vision.num_attention_heads,
             "--vision-ffn-hidden-size", vision.intermediate_size,
             "--img-h", vision.image_size, "--img-w", vision.image_size,
             "--patch-dim", vision.patch_size, "--vision-feature-layer", layer,
             "--vision-norm-epsilon", vision.layer_norm_eps,
             "--projector-type", "mlp", "--projector-ffn-hidden-size", text.hidden_size,
             "--image-token-id", hf_config.image_token_id]
    if kind == "clip" and strategy == "default":
        flags.append("--disable-vision-class-token")
    return [str(f) for f in flags]


def audio_flags(hf_config) -> List[str]:
    audio = hf_config.audio_config
    _need(audio.activation_function == "gelu",
          f"audio_config.activation_function {audio.activation_function!r}: only 'gelu'")
    _need(not getattr(audio, "scale_embedding", False),
          "audio_config.scale_embedding=True is not supported")
    flags = ["--vision-model-type", "none", "--audio-model-type", "whisper",
             "--audio-hidden-size", audio.d_model, "--audio-num-layers", audio.encoder_layers,
             "--audio-num-attention-heads", audio.encoder_attention_heads,
             "--audio-ffn-hidden-size", audio.encoder_ffn_dim,
             "--audio-num-mel-bins", audio.num_mel_bins,
             "--audio-max-source-positions", audio.max_source_positions,
             "--audio-pool-stride", 2, "--audio-norm-epsilon", 1e-5,  # nn.LayerNorm's
             "--audio-projector-type", "affine", "--audio-token-id", hf_config.audio_token_id]
    return [str(f) for f in flags]


def model_flags(hf_config) -> List[str]:
    family = family_for(hf_config)
    if not family.multimodal:
        return language_flags(hf_config) + ["--vision-model-type", "none"]
    if family.layout is QWEN2_AUDIO:
        return language_flags(hf_config.get_text_config()) + audio_flags(hf_config)
    return language_flags(hf_config.get_text_config()) + vision_flags(hf_config)
