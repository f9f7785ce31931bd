"""Weight table of Qwen2.5-VL's vision tower and patch merger (``Qwen2_5VLVisionWithMerger``
<- Hugging Face's ``Qwen2_5_VisionTransformerPretrainedModel``), and its two transforms.

Tables are relative to the tower (Hugging Face ``visual.`` / ``model.visual.``); ``prefixed``
places them. Megatron side: ``vision_model.`` (the ViT and ``ln_post`` = ``merger.ln_q``)
and ``vision_projection.`` (the merger MLP), the names the multimodal model gives an
encoder and its projector.
"""

from __future__ import annotations

from typing import Tuple

import torch

from ...hf.mapping import Rule, prefixed
from ...hf.transforms import GATE_UP, QKVPerGroup, Transform

_BLOCK = "blocks.{i}."
_LAYER = "decoder.layers.{i}."


class FusedQKVPerGroup(QKVPerGroup):
    """Hugging Face's fused ``qkv`` Linear, rows [all q heads; all k heads; all v heads]
    (``reshape(seq, 3, heads, head_dim)``), <-> Megatron's ``linear_qkv``, rows per
    key/value group [q, k, v of group 0; ...] (``QKVPerGroup``)."""

    def __init__(self, stack: str):
        super().__init__(stack)
        self.name = f"fused_qkv_per_group[{stack}]"

    def to_megatron(self, tensors, ctx):
        (qkv,) = tensors
        if qkv.shape[0] % 3:
            raise RuntimeError(f"a fused qkv of {qkv.shape[0]} rows is not 3 equal parts")
        return super().to_megatron(list(qkv.chunk(3, dim=0)), ctx)

    def to_hf(self, tensor, ctx):
        return [torch.cat(super().to_hf(tensor, ctx), dim=0)]


class Conv3dAsLinear(Transform):
    """The patch embedding: Conv3d weight [hidden, C, T, P, P] with kernel = stride = the
    whole patch <-> a linear weight [hidden, C*T*P*P] over the flattened patch (the
    processor flattens each patch in that same (C, T, P, P) order)."""

    def __init__(self, in_channels: int, temporal_patch_size: int, patch_size: int):
        self.kernel = (in_channels, temporal_patch_size, patch_size, patch_size)
        self.name = f"conv3d_as_linear[{'x'.join(map(str, self.kernel))}]"

    def to_megatron(self, tensors, ctx):
        (w,) = tensors
        if tuple(w.shape[1:]) != self.kernel:
            raise RuntimeError(f"expected a Conv3d kernel of {self.kernel}")
        return w.reshape(w.shape[0], -1)

    def to_hf(self, tensor, ctx):
        return [tensor.reshape(tensor.shape[0], *self.kernel).contiguous()]


def vision_tower_rules(in_channels: int = 3, temporal_patch_size: int = 2,
                       patch_size: int = 14, stack: str = "vision") -> Tuple[Rule, ...]:
    """``Qwen2_5VisionTransformer`` <- the tower without the merger MLP. ``stack``: the
    key of the head counts in the conversion ``Context``."""
    qkv = FusedQKVPerGroup(stack)
    return (
        Rule("patch_embed.weight", ("patch_embed.proj.weight",),
             Conv3dAsLinear(in_channels, temporal_patch_size, patch_size)),
        Rule(_LAYER + "input_layernorm.weight", (_BLOCK + "norm1.weight",)),
        Rule(_LAYER + "pre_mlp_layernorm.weight", (_BLOCK + "norm2.weight",)),
        *(r for p in ("weight", "bias") for r in (
            Rule(_LAYER + f"self_attention.linear_qkv.{p}", (_BLOCK + f"attn.qkv.{p}",), qkv),
            Rule(_LAYER + f"self_attention.linear_proj.{p}", (_BLOCK + f"attn.proj.{p}",)),
            Rule(_LAYER + f"mlp.linear_fc1.{p}",
                 (_BLOCK + f"mlp.gate_proj.{p}", _BLOCK + f"mlp.up_proj.{p}"), GATE_UP),
            Rule(_LAYER + f"mlp.linear_fc2.{p}", (_BLOCK + f"mlp.down_proj.{p}",)),
        )),
        Rule("ln_post.weight", ("merger.ln_q.weight",)),
    )


# The merger MLP (Linear, GELU, Linear) as a MultimodalProjector.
MERGER = tuple(Rule(f"encoder.linear_fc{n}.{p}", (f"merger.mlp.{i}.{p}",))
               for n, i in ((1, 0), (2, 2)) for p in ("weight", "bias"))


def qwen2_5_vl_vision_rules(hf_prefix: str = "", in_channels: int = 3,
                            temporal_patch_size: int = 2, patch_size: int = 14,
                            vision_prefix: str = "vision_model.",
                            projector_prefix: str = "vision_projection.",
                            stack: str = "vision") -> Tuple[Rule, ...]:
    """The tower and merger under ``hf_prefix`` (``model.visual.`` in a transformers 5.x
    ``Qwen2_5_VLForConditionalGeneration``, ``""`` for the tower model alone)."""
    return (prefixed(vision_tower_rules(in_channels, temporal_patch_size, patch_size, stack),
                     vision_prefix, hf_prefix)
            + prefixed(MERGER, projector_prefix, hf_prefix))
