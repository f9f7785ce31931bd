"""The planner's ``ModelSpec`` of a model configuration: each encoder as its family
declares it (``EncoderFamily.planner_spec``), the Llama-style LLM. Here, not in ``plan/``,
so the planner imports no family registry."""

from __future__ import annotations

from ..plan.model import LinearAttentionSpec, ModelSpec, TransformerSpec
from .registry import family_of


def model_spec(config, images_per_sample: int = 1, clips_per_sample: int = 1,
               name: str = "config") -> ModelSpec:
    """From a ``megatron_mm.config.MultimodalModelConfig``."""
    encoders = []
    for enc_name, enc in config.encoders.items():
        proj = config.projectors[enc_name]
        common = dict(projector_ffn_hidden_size=proj.ffn_hidden_size,
                      projector_type=proj.projector_type)
        family = family_of(enc)
        items = clips_per_sample if family.slot == "audio" else images_per_sample
        encoders.append(family.planner_spec(enc_name, enc, items, common))
    lm = config.language
    moe = {} if lm.moe is None else dict(  # the active parameters: top-k of the experts
        num_experts=lm.moe.num_experts, moe_router_topk=lm.moe.router_topk,
        moe_ffn_hidden_size=lm.moe.ffn_hidden_size,
        moe_layer_freq=list(lm.moe.pattern(lm.num_layers)))
    llm = TransformerSpec(
        hidden_size=lm.hidden_size, num_layers=lm.num_layers,
        ffn_hidden_size=lm.ffn_hidden_size, num_attention_heads=lm.num_attention_heads,
        num_query_groups=lm.num_query_groups, kv_channels=lm.kv_channels,
        gated_linear_unit=True, attention_output_gate=lm.attention_output_gate,
        vocab_size=lm.vocab_size_padded(1) if lm.vocab_size > 0 else 0, **moe,
        **linear_attention(lm))
    return ModelSpec(name=name, encoders=encoders, llm=llm,
                     frozen_encoders=sorted(config.freeze.encoders),
                     frozen_projectors=sorted(config.freeze.projectors),
                     freeze_llm=config.freeze.language_model,
                     tied_embeddings=not lm.untie_embeddings_and_output_weights)


def linear_attention(lm) -> dict:
    """A hybrid LLM's Gated DeltaNet sizes and per-layer pattern (``LinearAttentionConfig``
    by its Megatron-LM names), as ``TransformerSpec`` fields; none without."""
    la = lm.linear_attention
    if la is None:
        return {}
    spec = LinearAttentionSpec(**{name: getattr(la, name) for name in (
        "linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
        "linear_num_key_heads", "linear_num_value_heads", "chunk_size")})
    return dict(linear_attention=spec, linear_attention_freq=list(lm.linear_attention_pattern()))
