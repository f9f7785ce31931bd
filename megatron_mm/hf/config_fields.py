"""Hugging Face config fields that change a model's outputs and that megatron_mm does not
reproduce for every value: the values it accepts, and why the others are refused at
import. A field left out of these tables is either mapped onto a flag (``families.py``:
sizes, ``rms_norm_eps``, ``head_dim``, ``tie_word_embeddings``, ``rope_theta``, the towers'
``layer_norm_eps``, ``image_size``, ``patch_size``, ``sliding_window`` through
``longest_exact_sequence``, RoPE scaling in ``rope_scaling.py``, ...) or does not change
the forward of a trained model (initialisation, dropout, generation, token ids of the
tokenizer).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Sequence, Tuple

from ..families import TEXT_MODELS, text_model
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


def one_of(*values) -> Callable[[Any, Any], bool]:
    return lambda value, _: value in values


def sliding_window_layers(text) -> list:
    """Indices of the layers whose attention window is shorter than the longest sequence
    (``max_position_embeddings``): the only ones a window changes. Every layer where the
    text model says so (``TextModel.windows_every_layer``: Mistral) or names none; else the
    ``layer_types`` named ``sliding_attention`` (Qwen2 / Qwen3: from ``use_sliding_window``
    and ``max_window_layers``)."""
    window = getattr(text, "sliding_window", None)
    if window is None or window >= text.max_position_embeddings:
        return []
    types = getattr(text, "layer_types", None)
    if text_model(text.model_type).windows_every_layer or types is None:
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


@functools.cache
def language_fields() -> Tuple[Field, ...]:
    """The LLM's fields: its ``model_type`` one a family converts (``TEXT_MODELS`` of the
    registry), M-RoPE only where the text model rotates by it."""
    types = tuple(TEXT_MODELS)
    mrope = tuple(t for t in types if text_model(t).mrope_section is not None)
    return (
        Field("model_type", lambda v, _: v in types,
              f"the language models are {', '.join(types)}"),
        # transformers 5 folds a checkpoint's rope_scaling into rope_parameters (and an
        # M-RoPE model's rope_type "mrope" into "default" with an mrope_section).
        Field("rope_parameters.rope_type",
              lambda v, c: v == "default" or (v == "mrope" and c.model_type in mrope)
              or (v in ("llama3", "yarn") and c.model_type not in mrope),
              "the RoPE types implemented are 'default', 'llama3' (--use-rope-scaling) and "
              "'yarn' (--position-embedding-type yarn), and 'mrope' for Qwen2-VL / "
              "Qwen2.5-VL text models (without scaling)", "default"),
        Field("rope_parameters.mrope_section",
              lambda v, c: v is None or c.model_type in mrope,
              "M-RoPE (an mrope_section) is implemented for the Qwen2-VL / Qwen2.5-VL text "
              f"models ({', '.join(mrope)}) only"),
        Field("rope_parameters.partial_rotary_factor",
              lambda v, c: v in (1, 1.0) or (text_model(c.model_type).partial_rotary
                                             and 0 < v <= 1),
              "rotary embedding on part of each head is implemented for the Qwen3.5 text "
              "model only", 1.0),
        Field("hidden_act", one_of("silu"), "the language model's MLP is SwiGLU ('silu')"),
        Field("mlp_bias", one_of(False), "the language model's MLP has no biases", False),
        # Qwen2's q/k/v biases are its architecture (--add-qkv-bias); attention_bias
        # elsewhere biases o_proj too.
        Field("attention_bias", one_of(False),
              "biases on q/k/v and o_proj are not implemented (Qwen2's q/k/v bias is)", False),
    )
