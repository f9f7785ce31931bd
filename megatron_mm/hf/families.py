"""Hugging Face architectures: the record each family declares for one
(``Family``: how its config becomes megatron_mm's flags, as typed values by the parser's
dest, so a converted checkpoint rebuilds through the ordinary ``--load`` path, and which
weight table and on-disk layout it uses), the lookup through the family registry, and the
LLM's flags every architecture shares.

Config fields the megatron_mm model cannot reproduce for every value are refused at
import, naming the field and its value (the tables in ``config_fields.py`` and the
families' own).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

from ..families import ARCHITECTURES, architecture, text_model
from .config_fields import language_fields, longest_exact_sequence, refuse_unsupported
from .errors import ConversionError
from .layouts import CAUSAL_LM, Layout
from .rope_scaling import rope_scaling_flags
from .tables import causal_lm_rules

# megatron_mm flags as typed values: parser dest -> value (``--num-layers 2`` is
# {"num_layers": 2}; an on/off flag takes a bool; ``training/config/values.py`` reads them).
Flags = Dict[str, Any]

# The Hugging Face forward's arguments of an image model with fixed-size items.
IMAGE_INPUTS = ("input_ids", "attention_mask", "pixel_values")


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
    # ``flags(hf_config)`` -> megatron_mm ``Flags``. A family's own hooks (None: the shared
    # ones): ``rules`` called with the config (``config_rules``: its table depends on it);
    # ``media(inputs)`` -> the megatron_mm media dict and ``positions(hf_config, inputs)``
    # -> position ids (M-RoPE) for ``compare``; ``hf_inputs(hf_config, inputs)``: the
    # Hugging Face forward's arguments completed as its processor would;
    # ``file_flags(hf_dir, hf_config)``: ``Flags`` from the directory's other files
    # (processor configs).
    flags: Optional[Callable] = None
    config_rules: bool = False
    media: Optional[Callable] = None
    positions: Optional[Callable] = None
    hf_inputs: Optional[Callable] = None
    file_flags: Optional[Callable] = None

    def table(self, hf_config):
        """The weight rules of this family (for ``hf_config``)."""
        return self.rules(hf_config) if self.config_rules else self.rules()


@dataclass(frozen=True)
class TextModel:
    """An LLM decoder a family converts, by its Hugging Face text config's ``model_type``:
    the on/off flags its architecture turns on (their dests: ``add_qkv_bias``,
    ``qk_layernorm``),
    ``mrope_section``: M-RoPE, with this split of the rotary frequencies into temporal,
    height and width when the config names none (None: 1-D RoPE), ``mrope_interleaved``:
    those frequencies dealt to T, H, W in turn (Qwen3-VL, whatever the config says), and
    ``windows_every_layer``: a ``sliding_window`` applies to every layer,
    ``partial_rotary``: RoPE on a ``partial_rotary_factor`` of each head (the family maps
    it onto --rotary-percent)."""

    flags: Tuple[str, ...] = ()
    mrope_section: Optional[Tuple[int, ...]] = None
    mrope_interleaved: bool = False
    windows_every_layer: bool = False
    # rope_parameters.partial_rotary_factor (--rotary-percent) taken (Qwen3.5)
    partial_rotary: bool = False


def family_for(hf_config) -> Family:
    archs = list(getattr(hf_config, "architectures", None) or [])
    for arch in archs:
        if arch in ARCHITECTURES:
            return architecture(arch)
    raise ConversionError(
        f"unsupported architecture {archs or hf_config.model_type!r} (config.json "
        f"'architectures'); supported: {', '.join(sorted(ARCHITECTURES))}")


def language_flags(text, where: str = "",
                   tie_word_embeddings: Optional[bool] = None) -> Flags:
    """The LLM's flags from its (text) config. ``tie_word_embeddings``: where the model
    keeps it outside the text config (Qwen2-VL / Qwen2.5-VL: the top level)."""
    refuse_unsupported(text, language_fields(), where)
    model = text_model(text.model_type)
    rope = dict(getattr(text, "rope_parameters", None) or {})
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    flags = {"num_layers": text.num_hidden_layers, "hidden_size": text.hidden_size,
             "num_attention_heads": heads,
             "group_query_attention": True,
             "num_query_groups": text.num_key_value_heads or heads,
             "kv_channels": head_dim,
             # Sliding-window attention: exact for sequences up to the window.
             "max_position_embeddings": longest_exact_sequence(text),
             "rotary_base": rope.get("rope_theta", 10000.0),
             "norm_epsilon": text.rms_norm_eps}
    if getattr(text, "intermediate_size", None) is not None:  # none: MoE layers only
        flags["ffn_hidden_size"] = text.intermediate_size
    flags.update({dest: True for dest in model.flags})
    flags.update(rope_scaling_flags(text, where))
    if model.mrope_section is not None:  # M-RoPE: the config's split, else the model's
        flags.update(position_embedding_type="mrope",
                     mrope_section=list(rope.get("mrope_section") or model.mrope_section))
        if model.mrope_interleaved:
            flags["mrope_interleaved"] = True
    if tie_word_embeddings is None:
        tie_word_embeddings = text.tie_word_embeddings
    flags["untie_embeddings_and_output_weights"] = not tie_word_embeddings
    return flags


def causal_lm_flags(hf_config) -> Flags:
    return {**language_flags(hf_config), "vision_model_type": "none"}


def causal_lm(name: str) -> Dict[str, Family]:
    """An LLM family's one architecture, ``{name}ForCausalLM``."""
    arch = f"{name}ForCausalLM"
    return {arch: Family(arch, CAUSAL_LM, causal_lm_rules, False, flags=causal_lm_flags)}


def model_flags(hf_config) -> Flags:
    """The megatron_mm flags of a Hugging Face config (its family's ``flags``)."""
    return family_for(hf_config).flags(hf_config)
