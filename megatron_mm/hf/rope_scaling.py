"""Hugging Face RoPE scaling (``rope_parameters`` of rope_type ``llama3`` or ``yarn``) as
Megatron-LM's flags, onto Megatron-Core's rotary embeddings; what those cannot reproduce
is refused at import, naming the field.

- ``llama3`` -> ``--use-rope-scaling --rope-scaling-factor F``: Megatron-Core's
  ``RotaryEmbedding._apply_scaling`` with HF's formula, but with low_freq_factor 1,
  high_freq_factor 4 and original_max_position_embeddings 8192 fixed (every Llama 3.1 /
  3.2 / 3.3 checkpoint's values); other values are refused.
- ``yarn`` -> ``--position-embedding-type yarn`` and its flags: Megatron-Core's
  ``YarnRotaryEmbedding`` computes HF's frequencies (``truncate`` is
  ``--[no-]yarn-correction-range-round-to-int``, beta_fast / beta_slow default 32 / 1 as
  there) and Attention scales cos / sin by its concentration factor,
  ``(0.1 * mscale * ln(factor) + 1) / (0.1 * mscale_all_dim * ln(factor) + 1)``. HF's
  attention_factor: from mscale and mscale_all_dim when both are set (else
  ``0.1 * ln(factor) + 1``, Megatron-Core's defaults 1 and 0 give the same), or given
  outright, which ``--mscale (a - 1) / (0.1 * ln(factor))`` reproduces where factor > 1.
"""

from __future__ import annotations

import math

from .config_fields import Field, refuse_unsupported, value_of

ROPE_TYPE = "rope_parameters.rope_type"
# Megatron-Core's llama3 constants (``RotaryEmbedding._apply_scaling``'s defaults, which
# GPTModel does not let a caller change).
LLAMA3_FIXED = {"low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}


def _llama3_fixed(key: str, value) -> Field:
    return Field(f"rope_parameters.{key}",
                 lambda v, c: value_of(c, ROPE_TYPE) != "llama3" or v == value,
                 "Megatron-Core's llama3 RoPE scaling (--use-rope-scaling) fixes "
                 + ", ".join(f"{k}={v:g}" for k, v in LLAMA3_FIXED.items())
                 + " (Llama 3.1's)")


def _yarn_factor(text) -> float:
    """HF's: the ratio of the context lengths where the config gives no factor."""
    rope = text.rope_parameters
    factor = rope.get("factor")
    if factor is None:
        factor = text.max_position_embeddings / rope["original_max_position_embeddings"]
    return float(factor)


def _attention_factor_representable(value, text) -> bool:
    return (value_of(text, ROPE_TYPE) != "yarn" or value is None or value == 1
            or _yarn_factor(text) > 1)


ROPE_SCALING_FIELDS = tuple(_llama3_fixed(k, v) for k, v in LLAMA3_FIXED.items()) + (
    Field("rope_parameters.attention_factor", _attention_factor_representable,
          "with factor <= 1 Megatron-Core's YaRN scales cos / sin by 1"),
)


def rope_scaling_flags(text, where: str = "") -> dict:
    """Megatron-LM's flags for the text config's RoPE scaling ({} without any)."""
    refuse_unsupported(text, ROPE_SCALING_FIELDS, where)
    rope = getattr(text, "rope_parameters", None) or {}
    kind = rope.get("rope_type")
    if kind == "llama3":
        return {"use_rope_scaling": True, "rope_scaling_factor": float(rope["factor"])}
    if kind != "yarn":
        return {}
    factor = _yarn_factor(text)
    flags = {"position_embedding_type": "yarn", "rotary_scaling_factor": factor,
             "yarn_original_max_position_embeddings":
                 int(rope["original_max_position_embeddings"]),
             "yarn_beta_fast": float(rope.get("beta_fast") or 32),
             "yarn_beta_slow": float(rope.get("beta_slow") or 1),
             # HF reads it as a truth value: an explicit null does not truncate
             "yarn_correction_range_round_to_int": bool(rope.get("truncate", True))}
    attention, mscale, all_dim = (rope.get(k) for k in ("attention_factor", "mscale",
                                                        "mscale_all_dim"))
    if attention is not None and factor > 1:  # (else it is 1: ROPE_SCALING_FIELDS)
        # 0.1 * mscale * ln(factor) + 1 == attention_factor, over 1 (mscale_all_dim 0)
        flags.update(mscale=(attention - 1) / (0.1 * math.log(factor)), mscale_all_dim=0.0)
    elif attention is None and mscale and all_dim:
        flags.update(mscale=float(mscale), mscale_all_dim=float(all_dim))
    return flags
