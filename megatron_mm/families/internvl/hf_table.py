"""Weight table of InternVL's vision side (``InternViTWithProjector`` <- Hugging Face's
``InternVLVisionModel`` and ``InternVLMultiModalProjector``), and its patch-embedding
transform.

Tables are relative to the tower and the projector; ``internvit_rules`` places them:
transformers 5.x in memory ``model.vision_tower.`` / ``model.multi_modal_projector.``,
``save_pretrained`` and the ``-hf`` hub checkpoints ``vision_tower.`` /
``multi_modal_projector.``. Megatron side: ``vision_model.`` (the ViT) and
``vision_projection.`` (the projector). Hugging Face's separate q / k / v go to Megatron's
per-group ``linear_qkv`` (``QKVPerGroup``; InternViT has as many groups as heads).
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

from ...hf.mapping import Rule, prefixed
from ...hf.transforms import QKVPerGroup, Transform

_HF = "encoder.layer.{i}."
_LAYER = "decoder.layers.{i}."


class Conv2dAsLinear(Transform):
    """The patch embedding: Conv2d weight [hidden, C, P, P] with kernel = stride = the
    patch <-> a linear weight [hidden, C*P*P] over the flattened patch (the model
    flattens each patch in that same (C, P, P) order)."""

    def __init__(self, in_channels: int, patch_size: Optional[int] = None):
        # patch_size None: the square kernel the tensor's width gives (C*P*P)
        self.in_channels, self.patch_size = in_channels, patch_size
        self.name = f"conv2d_as_linear[{in_channels}x{patch_size or 'P'}x{patch_size or 'P'}]"

    def _kernel(self, width: int) -> tuple:
        c, p = self.in_channels, self.patch_size
        if p is None:
            p = math.isqrt(width // c)
        if c * p * p != width:
            raise RuntimeError(f"{self.name}: a linear of {width} inputs is no "
                               f"{c}-channel square patch")
        return c, p, p

    def to_megatron(self, tensors, ctx):
        (w,) = tensors
        c = self.in_channels
        if w.dim() != 4 or w.shape[1] != c or w.shape[2] != w.shape[3] or (
                self.patch_size not in (None, w.shape[2])):
            raise RuntimeError(f"{self.name}: expected a square Conv2d kernel, got "
                               f"{tuple(w.shape)}")
        return w.reshape(w.shape[0], -1)

    def to_hf(self, tensor, ctx):
        return [tensor.reshape(tensor.shape[0], *self._kernel(tensor.shape[1])).contiguous()]


def internvit_tower_rules(in_channels: int = 3, patch_size: Optional[int] = 14,
                          stack: str = "vision") -> Tuple[Rule, ...]:
    """``InternViT`` <- ``InternVLVisionModel``. A rule the built model has no tensor for
    (no QKV bias, no q/k norm, no ``ln_post``) is skipped. ``stack``: the key of the head
    counts in the conversion ``Context``."""
    qkv = QKVPerGroup(stack)
    attn = _HF + "attention."
    return (
        Rule("patch_embed.weight", ("embeddings.patch_embeddings.projection.weight",),
             Conv2dAsLinear(in_channels, patch_size)),
        Rule("patch_embed.bias", ("embeddings.patch_embeddings.projection.bias",)),
        Rule("class_token", ("embeddings.cls_token",)),
        Rule("position_embeddings", ("embeddings.position_embeddings",)),
        Rule(_LAYER + "ls1", (_HF + "lambda_1",)),
        Rule(_LAYER + "ls2", (_HF + "lambda_2",)),
        Rule(_LAYER + "self_attention.q_layernorm.weight", (attn + "q_norm.weight",)),
        Rule(_LAYER + "self_attention.k_layernorm.weight", (attn + "k_norm.weight",)),
        *(r for p in ("weight", "bias") for r in (
            Rule(_LAYER + f"input_layernorm.{p}", (_HF + f"layernorm_before.{p}",)),
            Rule(_LAYER + f"pre_mlp_layernorm.{p}", (_HF + f"layernorm_after.{p}",)),
            Rule(_LAYER + f"self_attention.linear_qkv.{p}",
                 tuple(attn + f"{n}_proj.{p}" for n in "qkv"), qkv),
            Rule(_LAYER + f"self_attention.linear_proj.{p}",
                 (attn + f"projection_layer.{p}",)),
            Rule(_LAYER + f"mlp.linear_fc1.{p}", (_HF + f"mlp.fc1.{p}",)),
            Rule(_LAYER + f"mlp.linear_fc2.{p}", (_HF + f"mlp.fc2.{p}",)),
            Rule(f"ln_post.{p}", (f"layernorm.{p}",)),
        )),
    )


# InternVLMultiModalProjector (LayerNorm, Linear, GELU, Linear) as an InternVLProjector.
PROJECTOR = tuple(
    r for p in ("weight", "bias") for r in (
        Rule(f"layer_norm.{p}", (f"layer_norm.{p}",)),
        Rule(f"encoder.linear_fc1.{p}", (f"linear_1.{p}",)),
        Rule(f"encoder.linear_fc2.{p}", (f"linear_2.{p}",)),
    ))


def internvit_rules(vision_hf_prefix: str = "model.vision_tower.",
                    projector_hf_prefix: str = "model.multi_modal_projector.",
                    in_channels: int = 3, patch_size: Optional[int] = 14,
                    vision_prefix: str = "vision_model.",
                    projector_prefix: str = "vision_projection.",
                    stack: str = "vision") -> Tuple[Rule, ...]:
    """The tower and the projector under their Hugging Face prefixes (defaults: a
    transformers 5.x ``InternVLForConditionalGeneration`` in memory; ``vision_tower.`` and
    ``multi_modal_projector.`` for its saved / hub files)."""
    return (prefixed(internvit_tower_rules(in_channels, patch_size, stack), vision_prefix,
                     vision_hf_prefix)
            + prefixed(PROJECTOR, projector_prefix, projector_hf_prefix))


def internvl_rules() -> Tuple[Rule, ...]:
    """``InternVLForConditionalGeneration`` (transformers 5 in-memory names): the LLM
    (Qwen2 / Llama tables), InternViT and its projector; the patch size comes from the
    patch embedding's shape."""
    from ...hf.tables import LANGUAGE, OUTPUT_LAYER

    return (prefixed(LANGUAGE, "language_model.", "model.language_model.")
            + prefixed(OUTPUT_LAYER, "language_model.", "")
            + internvit_rules(patch_size=None))
