"""Supported Hugging Face architectures: how each one's config becomes megatron_mm's
command-line flags (so a converted checkpoint rebuilds through the ordinary ``--load``
path), which weight table and on-disk layout it uses.

Config fields the megatron_mm model cannot reproduce for every value are refused at
import, naming the field and its value (the tables in ``config_fields.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

from .config_fields import (AUDIO_FIELDS, DEFAULT_MROPE_SECTION, LANGUAGE_FIELDS, LLAVA_FIELDS,
                            MROPE_LANGUAGE_TYPES, VISION_FIELDS, VISION_TYPES,
                            longest_exact_sequence, refuse_unsupported)
from . import qwen2_5_vl
from .errors import ConversionError
from .layouts import CAUSAL_LM, LLAVA, QWEN2_AUDIO, Layout
from .tables import causal_lm_rules, llava_rules, qwen2_audio_rules


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
    # A family's own hooks (None: the shared ones): ``flags(hf_config)`` -> megatron_mm
    # flags; ``rules`` called with the config (``config_rules``: its table depends on it);
    # ``media(inputs)`` -> the megatron_mm media dict and ``positions(hf_config, inputs)``
    # -> position ids (M-RoPE) for ``compare``; ``hf_inputs(hf_config, inputs)``: the
    # Hugging Face forward's arguments completed as its processor would;
    # ``file_flags(hf_dir, hf_config)``: flags from the directory's other files (processor
    # configs).
    flags: Optional[Callable] = None
    config_rules: bool = False
    media: Optional[Callable] = None
    positions: Optional[Callable] = None
    hf_inputs: Optional[Callable] = None
    file_flags: Optional[Callable] = None

    def table(self, hf_config):
        """The weight rules of this family (for ``hf_config``)."""
        return self.rules(hf_config) if self.config_rules else self.rules()


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
    # Native-resolution ViT (window attention) + patch merger + Qwen2 with M-RoPE.
    Family("Qwen2_5_VLForConditionalGeneration", qwen2_5_vl.QWEN2_5_VL, qwen2_5_vl.rules,
           True, inputs=qwen2_5_vl.INPUTS, flags=qwen2_5_vl.model_flags, config_rules=True,
           media=qwen2_5_vl.megatron_media, positions=qwen2_5_vl.position_ids,
           hf_inputs=qwen2_5_vl.hf_inputs, file_flags=qwen2_5_vl.processor_flags),
)}


def family_for(hf_config) -> Family:
    archs = list(getattr(hf_config, "architectures", None) or [])
    for arch in archs:
        if arch in FAMILIES:
            return FAMILIES[arch]
    raise ConversionError(
        f"unsupported architecture {archs or hf_config.model_type!r} (config.json "
        f"'architectures'); supported: {', '.join(sorted(FAMILIES))}")


def language_flags(text, where: str = "",
                   tie_word_embeddings: Optional[bool] = None) -> List[str]:
    """The LLM's flags from its (text) config. ``tie_word_embeddings``: where the model
    keeps it outside the text config (Qwen2-VL / Qwen2.5-VL: the top level)."""
    refuse_unsupported(text, LANGUAGE_FIELDS, where)
    kind = text.model_type
    rope = dict(getattr(text, "rope_parameters", None) or {})
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    flags = ["--num-layers", text.num_hidden_layers, "--hidden-size", text.hidden_size,
             "--ffn-hidden-size", text.intermediate_size, "--num-attention-heads", heads,
             "--group-query-attention",
             "--num-query-groups", text.num_key_value_heads or heads,
             "--kv-channels", head_dim,
             # Sliding-window attention: exact for sequences up to the window.
             "--max-position-embeddings", longest_exact_sequence(text),
             "--rotary-base", rope.get("rope_theta", 10000.0),
             "--norm-epsilon", text.rms_norm_eps]
    if kind == "qwen2" or kind in MROPE_LANGUAGE_TYPES:
        flags.append("--add-qkv-bias")
    if kind == "qwen3":
        flags.append("--qk-layernorm")
    if kind in MROPE_LANGUAGE_TYPES:
        flags += mrope_flags(rope)
    if tie_word_embeddings is None:
        tie_word_embeddings = text.tie_word_embeddings
    if not tie_word_embeddings:
        flags.append("--untie-embeddings-and-output-weights")
    return [str(f) for f in flags]


def mrope_flags(rope: dict) -> List:
    """Qwen2-VL / Qwen2.5-VL text models: M-RoPE with the config's split of the rotary
    frequencies into temporal, height and width (transformers' default without one)."""
    section = rope.get("mrope_section") or DEFAULT_MROPE_SECTION
    return ["--position-embedding-type", "mrope", "--mrope-section", *section]


def vision_flags(hf_config) -> List[str]:
    vision, text = hf_config.vision_config, hf_config.get_text_config()
    refuse_unsupported(vision, VISION_FIELDS, "vision_config.")
    refuse_unsupported(hf_config, LLAVA_FIELDS)
    kind = VISION_TYPES[vision.model_type]
    layer = hf_config.vision_feature_layer
    strategy = hf_config.vision_feature_select_strategy
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
    refuse_unsupported(audio, AUDIO_FIELDS, "audio_config.")
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
    if family.flags is not None:
        return family.flags(hf_config)
    if not family.multimodal:
        return language_flags(hf_config) + ["--vision-model-type", "none"]
    if family.layout is QWEN2_AUDIO:
        return language_flags(hf_config.get_text_config(), "text_config.") + audio_flags(
            hf_config)
    return language_flags(hf_config.get_text_config(), "text_config.") + vision_flags(hf_config)
