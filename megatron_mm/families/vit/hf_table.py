"""The CLIP / SigLIP towers' and LLaVA's weight tables: Megatron-Core names (left) from
Hugging Face names (right)."""

from __future__ import annotations

from ...hf.mapping import Rule, prefixed
from ...hf.tables import LANGUAGE, LAYER, OUTPUT_LAYER
from ...hf.transforms import CLASS_TOKEN, QKVPerGroup

_QKV_VIT = QKVPerGroup("vision")

# CLIP and SigLIP towers (VisionTransformer <- CLIPVisionModel / SiglipVisionModel).
VISION = (
    Rule("class_token", ("embeddings.class_embedding",), CLASS_TOKEN),
    Rule("conv1.weight", ("embeddings.patch_embedding.weight",)),
    Rule("conv1.bias", ("embeddings.patch_embedding.bias",)),
    Rule("position_embeddings.weight", ("embeddings.position_embedding.weight",)),
    *(Rule(f"ln_pre.{p}", (f"pre_layrnorm.{p}",)) for p in ("weight", "bias")),
    *(Rule(f"ln_post.{p}", (f"post_layernorm.{p}",)) for p in ("weight", "bias")),
    *(r for p in ("weight", "bias") for r in (
        Rule(LAYER + f"input_layernorm.{p}", (f"encoder.layers.{{i}}.layer_norm1.{p}",)),
        Rule(LAYER + f"self_attention.linear_qkv.{p}",
             tuple(f"encoder.layers.{{i}}.self_attn.{x}_proj.{p}" for x in "qkv"), _QKV_VIT),
        Rule(LAYER + f"self_attention.linear_proj.{p}",
             (f"encoder.layers.{{i}}.self_attn.out_proj.{p}",)),
        Rule(LAYER + f"pre_mlp_layernorm.{p}", (f"encoder.layers.{{i}}.layer_norm2.{p}",)),
        Rule(LAYER + f"mlp.linear_fc1.{p}", (f"encoder.layers.{{i}}.mlp.fc1.{p}",)),
        Rule(LAYER + f"mlp.linear_fc2.{p}", (f"encoder.layers.{{i}}.mlp.fc2.{p}",)),
    )),
)

# LLaVA's MLP projector (MultimodalProjector <- LlavaMultiModalProjector).
PROJECTOR = tuple(Rule(f"encoder.linear_fc{n}.{p}", (f"linear_{n}.{p}",))
                  for n in (1, 2) for p in ("weight", "bias"))


def llava_rules():
    return (prefixed(LANGUAGE, "language_model.", "model.language_model.")
            + prefixed(OUTPUT_LAYER, "language_model.", "")
            + prefixed(VISION, "vision_model.", "model.vision_tower.")
            + prefixed(PROJECTOR, "vision_projection.", "model.multi_modal_projector."))
