"""Supported Hugging Face architectures: how each one's config becomes megatron_mm's
command-line flags (so a converted checkpoint rebuilds through the ordinary ``--load``
path), which weight table and on-disk layout it uses.

Config fields the megatron_mm model cannot reproduce for every value are refused at
import, naming the field and its value (the tables in ``config_fields.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Tuple

from .config_fields import (AUDIO_FIELDS, INTERNVL_FIELDS, INTERNVL_VISION_FIELDS,
                            LANGUAGE_FIELDS, LLAVA_FIELDS, VISION_FIELDS, VISION_TYPES,
                            longest_exact_sequence, refuse_unsupported)
from .errors import ConversionError
from .internvit_table import internvl_rules
from .layouts import CAUSAL_LM, INTERNVL, LLAVA, QWEN2_AUDIO, Layout
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
    # InternViT (layer scale, QK norm) + pixel shuffle + LayerNorm/MLP projector; a
    # batch's pixel_values are its images' tiles. Unused: the tower's layers past the
    # feature layer and its final LayerNorm when an earlier layer is taken.
    Family("InternVLForConditionalGeneration", INTERNVL, internvl_rules, True,
           (r"model\.vision_tower\.encoder\.layer\.\d+\..*",
            r"model\.vision_tower\.layernorm\..*"), _IMAGE_INPUTS),
)}


def family_for(hf_config) -> Family:
    archs = list(getattr(hf_config, "architectures", None) or [])
    for arch in archs:
        if arch in FAMILIES:
            return FAMILIES[arch]
    raise ConversionError(
        f"unsupported architecture {archs or hf_config.model_type!r} (config.json "
        f"'architectures'); supported: {', '.join(sorted(FAMILIES))}")


def language_flags(text, where: str = "") -> List[str]:
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
    if kind == "qwen2":
        flags.append("--add-qkv-bias")
    if kind == "qwen3":
        flags.append("--qk-layernorm")
    if not text.tie_word_embeddings:
        flags.append("--untie-embeddings-and-output-weights")
    return [str(f) for f in flags]


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


def internvl_flags(hf_config) -> List[str]:
    """InternVL: the tower, the pixel shuffle and the projector; the LLM's tied output
    layer is the top-level ``tie_word_embeddings`` (InternVLForConditionalGeneration ties
    by it, whatever the text config says)."""
    vision, text = hf_config.vision_config, hf_config.get_text_config()
    refuse_unsupported(vision, INTERNVL_VISION_FIELDS, "vision_config.")
    refuse_unsupported(hf_config, INTERNVL_FIELDS)
    size, patch = (v[0] if isinstance(v, (list, tuple)) else v
                   for v in (vision.image_size, vision.patch_size))
    flags = ["--vision-model-type", "internvit", "--vision-hidden-size", vision.hidden_size,
             "--vision-num-layers", vision.num_hidden_layers,
             "--vision-num-attention-heads", vision.num_attention_heads,
             "--vision-ffn-hidden-size", vision.intermediate_size,
             "--img-h", size, "--img-w", size, "--patch-dim", patch,
             "--vision-feature-layer", hf_config.vision_feature_layer,
             "--vision-norm-epsilon", vision.layer_norm_eps,
             "--vision-norm-type", vision.norm_type,
             "--downsample-ratio", hf_config.downsample_ratio,
             "--projector-type", "mlp", "--projector-ffn-hidden-size", text.hidden_size,
             "--image-token-id", hf_config.image_token_id]
    for flag, on in (("--vision-qk-norm", vision.use_qk_norm),
                     ("--vision-add-qkv-bias", vision.attention_bias),
                     ("--vision-final-layernorm", not vision.use_mean_pooling)):
        if on:
            flags.append(flag)
    language = [f for f in language_flags(text, "text_config.")
                if f != "--untie-embeddings-and-output-weights"]
    if not getattr(hf_config, "tie_word_embeddings", True):
        language.append("--untie-embeddings-and-output-weights")
    return language + [str(f) for f in flags]


def model_flags(hf_config) -> List[str]:
    family = family_for(hf_config)
    if family.layout is INTERNVL:
        return internvl_flags(hf_config)
    if not family.multimodal:
        return language_flags(hf_config) + ["--vision-model-type", "none"]
    if family.layout is QWEN2_AUDIO:
        return language_flags(hf_config.get_text_config(), "text_config.") + audio_flags(
            hf_config)
    return language_flags(hf_config.get_text_config(), "text_config.") + vision_flags(hf_config)
