"""Hugging Face config fields that change a model's outputs and that megatron_mm does not
reproduce for every value: the values it accepts, and why the others are refused at
import. A field left out of these tables is either mapped onto a flag (``families.py``:
sizes, ``rms_norm_eps``, ``head_dim``, ``tie_word_embeddings``, ``rope_theta``, the towers'
``layer_norm_eps``, ``image_size``, ``patch_size``, ``sliding_window`` through
``longest_exact_sequence``, ...) or does not change the forward of a trained model
(initialisation, dropout, generation, token ids of the tokenizer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .errors import ConversionError

_MISSING = object()


@dataclass(frozen=True)
class Field:
    name: str  # attribute of the config section; dots go into dicts (rope_parameters.x)
    accepts: Callable[[Any, Any], bool]  # (value, the whole section) -> reproduced?
    reason: str  # what megatron_mm does, said to the user who has another value
    default: Any = None  # the value when the config does not carry the field


def value_of(config, name: str, default=None):
    value = config
    for part in name.split("."):
        value = (value.get(part, _MISSING) if isinstance(value, dict)
                 else getattr(value, part, _MISSING))
        if value is _MISSING or value is None:
            return default
    return value


def refuse_unsupported(config, fields: Sequence[Field], where: str = "") -> None:
    """ConversionError naming the first field whose value megatron_mm cannot reproduce;
    ``where`` prefixes the field's name (``text_config.``, ``vision_config.``)."""
    for field in fields:
        value = value_of(config, field.name, field.default)
        if not field.accepts(value, config):
            raise ConversionError(f"config {where}{field.name}={value!r} is not supported: "
                                  f"{field.reason}")


def _one_of(*values) -> Callable[[Any, Any], bool]:
    return lambda value, _: value in values


def sliding_window_layers(text) -> list:
    """Indices of the layers whose attention window is shorter than the longest sequence
    (``max_position_embeddings``): the only ones a window changes. Mistral windows every
    layer; Qwen2 / Qwen3 the ``layer_types`` named ``sliding_attention`` (from
    ``use_sliding_window`` and ``max_window_layers``)."""
    window = getattr(text, "sliding_window", None)
    if window is None or window >= text.max_position_embeddings:
        return []
    types = getattr(text, "layer_types", None)
    if text.model_type == "mistral" or types is None:
        return list(range(text.num_hidden_layers))
    return [i for i, t in enumerate(types) if t == "sliding_attention"]


def longest_exact_sequence(text) -> int:
    """The ``--max-position-embeddings`` a converted LLM gets: Hugging Face's, capped at
    the sliding window when a layer has one. Within the window a sliding-window mask
    equals the causal mask (a query at position q < W sees keys q - W < k <= q, i.e. all
    of them), so the converted model is exact for every sequence it accepts, and a longer
    ``--seq-length`` is refused (``--seq-length exceeds --max-position-embeddings``)."""
    if sliding_window_layers(text):
        return text.sliding_window
    return text.max_position_embeddings


# Text models of Qwen2-VL and Qwen2.5-VL: Qwen2 decoders rotating by M-RoPE (3-D positions).
MROPE_LANGUAGE_TYPES = ("qwen2_vl_text", "qwen2_5_vl_text")
# transformers' M-RoPE split of a head's rotary frequencies when the config names none.
DEFAULT_MROPE_SECTION = (16, 24, 24)
LANGUAGE_TYPES = ("llama", "mistral", "qwen2", "qwen3") + MROPE_LANGUAGE_TYPES

LANGUAGE_FIELDS = (
    Field("model_type", lambda v, _: v in LANGUAGE_TYPES,
          f"the language models are {', '.join(LANGUAGE_TYPES)}"),
    # transformers 5 folds a checkpoint's rope_scaling into rope_parameters (and an
    # M-RoPE model's rope_type "mrope" into "default" with an mrope_section).
    Field("rope_parameters.rope_type",
          lambda v, c: v == "default" or (v == "mrope" and c.model_type in MROPE_LANGUAGE_TYPES),
          "RoPE scaling (rope_scaling / rope_parameters) is not implemented; only "
          "'default' (and 'mrope' for Qwen2-VL / Qwen2.5-VL text models)", "default"),
    Field("rope_parameters.mrope_section",
          lambda v, c: v is None or c.model_type in MROPE_LANGUAGE_TYPES,
          "M-RoPE (an mrope_section) is implemented for the Qwen2-VL / Qwen2.5-VL text models "
          f"({', '.join(MROPE_LANGUAGE_TYPES)}) only"),
    Field("rope_parameters.partial_rotary_factor", _one_of(1, 1.0),
          "rotary embedding on part of each head is not implemented", 1.0),
    Field("hidden_act", _one_of("silu"), "the language model's MLP is SwiGLU ('silu')"),
    Field("mlp_bias", _one_of(False), "the language model's MLP has no biases", False),
    # Qwen2's q/k/v biases are its architecture (--add-qkv-bias); attention_bias
    # elsewhere biases o_proj too.
    Field("attention_bias", _one_of(False),
          "biases on q/k/v and o_proj are not implemented (Qwen2's q/k/v bias is)", False),
)

# Hugging Face activation of each tower type; megatron_mm's ViT has exactly these.
VISION_ACTIVATION = {"clip": "quick_gelu", "siglip": "gelu_pytorch_tanh"}
VISION_TYPES = {"clip_vision_model": "clip", "siglip_vision_model": "siglip"}

VISION_FIELDS = (
    Field("model_type", lambda v, _: v in VISION_TYPES,
          f"the vision towers are {', '.join(VISION_TYPES)}"),
    Field("hidden_act",
          lambda v, c: v == VISION_ACTIVATION.get(VISION_TYPES.get(c.model_type)),
          "CLIP towers use 'quick_gelu', SigLIP towers 'gelu_pytorch_tanh'"),
    Field("num_channels", _one_of(3), "images are RGB", 3),
)

# Qwen2.5-VL's tower (its sizes, window, merge and patch sizes map onto flags:
# hf/qwen2_5_vl.py).
QWEN2_5_VL_VISION_FIELDS = (
    Field("hidden_act", _one_of("silu"), "the Qwen2.5-VL vision MLP is SwiGLU ('silu')",
          "silu"),
    Field("in_channels", _one_of(3), "images are RGB", 3),
)

# LLaVA-1.5 / LLaVA-OneVision top level (the towers and the LLM are checked above).
LLAVA_FIELDS = (
    Field("vision_feature_layer", lambda v, _: isinstance(v, int),
          "features of a single layer (an int) only"),
    Field("vision_feature_select_strategy", _one_of("default", "full"),
          "'default' (drop the class token) or 'full'"),
    # "default" drops the first token: CLIP's class token, but a patch token of SigLIP.
    Field("vision_feature_select_strategy",
          lambda v, c: v == "full" or c.vision_config.model_type == "clip_vision_model",
          "'default' drops a SigLIP patch token, which megatron_mm does not reproduce; "
          "SigLIP checkpoints use 'full'"),
    Field("projector_hidden_act", _one_of("gelu"), "the projector is Linear-GELU-Linear"),
    Field("multimodal_projector_bias", _one_of(True), "the projector's linears have biases",
          True),
)

AUDIO_FIELDS = (
    Field("activation_function", _one_of("gelu"), "Whisper's MLP uses exact 'gelu'"),
    Field("scale_embedding", _one_of(False),
          "the audio encoder does not scale its input by sqrt(d_model)", False),
)
