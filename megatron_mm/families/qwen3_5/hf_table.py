"""Weight table of Qwen3.5's hybrid LLM (``GPTModel`` with Gated DeltaNet layers <-
transformers' ``Qwen3_5TextModel``), relative to the decoder (``model.language_model.``).

- Gated attention: Hugging Face's ``q_proj`` holds each head's query then its gate
  ([q_h; gate_h] per head); Megatron-Core's ``linear_qkv`` per key/value group
  [queries of the group, their gates, k, v] (``Attention.get_query_key_value_tensors``).
- GDN: Megatron-Core's ``in_proj`` is [q k v | z | beta | alpha] (Hugging Face's
  ``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a`` one after the other) in the
  TP=1 layout the converter writes; Megatron-Core's distributed checkpoint splits it by
  those sections, so it loads at any TP. ``conv1d``, ``A_log``, ``dt_bias``, the gated
  ``norm`` (``out_norm``) and ``out_proj`` keep their tensors.
- Norms: Hugging Face's zero-centred norms (1 + weight) are Megatron-Core's with
  ``layernorm_zero_centered_gamma``; GDN's gated norm is plain on both sides: every norm
  weight converts as it is.
"""

from __future__ import annotations

from typing import Sequence, Tuple

import torch

from ...hf.mapping import Rule
from ...hf.tables import LANGUAGE, LAYER
from ...hf.transforms import QKVPerGroup, Transform

_ATTN = "layers.{i}.self_attn."
_GDN = "layers.{i}.linear_attn."


class GatedQKVPerGroup(QKVPerGroup):
    """q (with each head's gate), k, v -> ``linear_qkv`` [q, gate, k, v] per group."""

    def __init__(self, stack: str):
        super().__init__(stack)
        self.name = f"gated_qkv_per_group[{stack}]"

    def to_megatron(self, tensors, ctx):
        qg, k, v = tensors
        heads, groups = ctx.heads[self.stack]
        head_dim = k.shape[0] // groups
        rest = qg.shape[1:]
        qg = qg.reshape(groups, heads // groups, 2, head_dim, *rest)
        q, gate = qg[:, :, 0], qg[:, :, 1]  # [groups, heads per group, head_dim, ...]
        parts = [t.reshape(groups, -1, *rest) for t in (q, gate)]
        parts += [k.reshape(groups, head_dim, *rest), v.reshape(groups, head_dim, *rest)]
        return torch.cat(parts, dim=1).reshape(-1, *rest)

    def to_hf(self, tensor, ctx):
        heads, groups = ctx.heads[self.stack]
        head_dim = tensor.shape[0] // (2 * heads + 2 * groups)
        per = heads // groups
        rest = tensor.shape[1:]
        grouped = tensor.reshape(groups, (2 * per + 2) * head_dim, *rest)
        q, gate, k, v = grouped.split([per * head_dim, per * head_dim, head_dim, head_dim],
                                      dim=1)
        qg = torch.stack([q.reshape(groups, per, head_dim, *rest),
                          gate.reshape(groups, per, head_dim, *rest)], dim=2)
        return [t.reshape(-1, *rest).contiguous() for t in (qg, k, v)]


class Concatenated(Transform):
    """Row blocks of the given sizes one after the other (GDN's ``in_proj``)."""

    def __init__(self, sizes: Sequence[int]):
        self.sizes = tuple(sizes)
        self.name = f"concatenated{list(self.sizes)}"

    def to_megatron(self, tensors, ctx):
        if tuple(t.shape[0] for t in tensors) != self.sizes:  # a mismatch naming them
            raise RuntimeError(f"rows {[t.shape[0] for t in tensors]}, the config's "
                               f"{list(self.sizes)}")
        return torch.cat(list(tensors), dim=0)

    def to_hf(self, tensor, ctx):
        return [t.contiguous() for t in tensor.split(self.sizes, dim=0)]


def gdn_in_proj_sizes(text) -> Tuple[int, int, int, int]:
    """Rows of ``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``."""
    key = text.linear_key_head_dim * text.linear_num_key_heads
    value = text.linear_value_head_dim * text.linear_num_value_heads
    return (2 * key + value, value, text.linear_num_value_heads, text.linear_num_value_heads)


def hybrid_language_rules(text) -> Tuple[Rule, ...]:
    """The decoder's rules: the gated attention's and GDN's first (a rule's first match
    wins), then the shared LLM table (embedding, norms, MLP, final norm)."""
    return (
        Rule(LAYER + "self_attention.linear_qkv.weight",
             tuple(f"{_ATTN}{x}_proj.weight" for x in "qkv"), GatedQKVPerGroup("language")),
        Rule(LAYER + "self_attention.in_proj.weight",
             tuple(f"{_GDN}in_proj_{x}.weight" for x in ("qkv", "z", "b", "a")),
             Concatenated(gdn_in_proj_sizes(text))),
        # the TE GDN layer's input norm is fused into in_proj
        Rule(LAYER + "self_attention.in_proj.layer_norm_weight",
             ("layers.{i}.input_layernorm.weight",)),
        Rule(LAYER + "self_attention.conv1d.weight", (_GDN + "conv1d.weight",)),
        Rule(LAYER + "self_attention.A_log", (_GDN + "A_log",)),
        Rule(LAYER + "self_attention.dt_bias", (_GDN + "dt_bias",)),
        Rule(LAYER + "self_attention.out_norm.weight", (_GDN + "norm.weight",)),
        Rule(LAYER + "self_attention.out_proj.weight", (_GDN + "out_proj.weight",)),
    ) + LANGUAGE
