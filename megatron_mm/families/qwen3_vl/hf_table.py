"""Weight table of Qwen3-VL's vision tower and mergers (``Qwen3VLEncoder`` +
``Qwen3VLMergers`` <- Hugging Face's ``Qwen3VLVisionModel``), relative to the tower
(``model.visual.``). Megatron side: ``vision_model.`` (the tower and ``ln_post`` = the final
merger's ``norm``) and ``vision_projection.`` (the final merger's MLP and the DeepStack
mergers); the fused qkv and the Conv3d patch kernel go through Qwen2.5-VL's transforms."""

from __future__ import annotations

from typing import Tuple

from ...hf.mapping import Rule, prefixed
from ..qwen2_5_vl.hf_table import Conv3dAsLinear, FusedQKVPerGroup

_BLOCK = "blocks.{i}."
_LAYER = "decoder.layers.{i}."
_BOTH = ("weight", "bias")


def vision_tower_rules(in_channels: int, temporal_patch_size: int, patch_size: int,
                       stack: str = "vision") -> Tuple[Rule, ...]:
    qkv = FusedQKVPerGroup(stack)
    return (
        Rule("patch_embed.weight", ("patch_embed.proj.weight",),
             Conv3dAsLinear(in_channels, temporal_patch_size, patch_size)),
        Rule("patch_embed.bias", ("patch_embed.proj.bias",)),
        Rule("pos_embed.weight", ("pos_embed.weight",)),
        *(r for p in _BOTH for r in (
            Rule(_LAYER + f"input_layernorm.{p}", (_BLOCK + f"norm1.{p}",)),
            Rule(_LAYER + f"pre_mlp_layernorm.{p}", (_BLOCK + f"norm2.{p}",)),
            Rule(_LAYER + f"self_attention.linear_qkv.{p}", (_BLOCK + f"attn.qkv.{p}",), qkv),
            Rule(_LAYER + f"self_attention.linear_proj.{p}", (_BLOCK + f"attn.proj.{p}",)),
            Rule(_LAYER + f"mlp.linear_fc1.{p}", (_BLOCK + f"mlp.linear_fc1.{p}",)),
            Rule(_LAYER + f"mlp.linear_fc2.{p}", (_BLOCK + f"mlp.linear_fc2.{p}",)),
            Rule(f"ln_post.{p}", (f"merger.norm.{p}",)),
        )),
    )


def merger_rules(deepstack: int) -> Tuple[Rule, ...]:
    """The final merger's MLP and the ``deepstack`` DeepStack mergers (norm and MLP)."""
    final = tuple(Rule(f"encoder.linear_fc{n}.{p}", (f"merger.linear_fc{n}.{p}",))
                  for n in (1, 2) for p in _BOTH)
    stacked = tuple(
        r for j in range(deepstack) for p in _BOTH for r in (
            Rule(f"deepstack.{j}.norm.{p}", (f"deepstack_merger_list.{j}.norm.{p}",)),
            *(Rule(f"deepstack.{j}.merger.encoder.linear_fc{n}.{p}",
                   (f"deepstack_merger_list.{j}.linear_fc{n}.{p}",)) for n in (1, 2))))
    return final + stacked


def qwen3_vl_vision_rules(hf_prefix: str, in_channels: int, temporal_patch_size: int,
                          patch_size: int, deepstack: int) -> Tuple[Rule, ...]:
    """The tower and mergers under ``hf_prefix`` (``model.visual.``)."""
    return (prefixed(vision_tower_rules(in_channels, temporal_patch_size, patch_size),
                     "vision_model.", hf_prefix)
            + prefixed(merger_rules(deepstack), "vision_projection.", hf_prefix))
