"""Build a MultimodalModel from its config (inside an initialised Megatron-Core world)."""

from __future__ import annotations

from typing import Mapping, Optional

from megatron.core.models.gpt import GPTModel
from megatron.core.models.vision.multimodal_projector import MultimodalProjector

from ..config import MultimodalModelConfig
from .multimodal import MultimodalModel
from .specs import get_layer_specs
from .transformer_configs import (
    BuildSettings,
    language_transformer_config,
    projector_transformer_config,
    vision_transformer_config,
)
from .vision import VisionTransformer

__all__ = ["BuildSettings", "build_model"]


def build_model(config: MultimodalModelConfig, settings: BuildSettings,
                media_token_ids: Mapping[str, int], pre_process: bool = True,
                post_process: bool = True, vp_stage: Optional[int] = None) -> MultimodalModel:
    """The model, or one pipeline chunk of it (``vp_stage`` with virtual stages): encoders
    and projectors are built with the LLM's embedding (``pre_process``, the first chunk),
    the output layer with ``post_process``."""
    config.validate_parallel(settings.tensor_model_parallel_size)
    lm = config.language
    specs = get_layer_specs(settings.transformer_impl, qk_layernorm=lm.qk_layernorm)
    language_model = GPTModel(
        config=language_transformer_config(lm, settings),
        transformer_layer_spec=specs.language_layer,
        vocab_size=lm.vocab_size_padded(settings.tensor_model_parallel_size),
        max_sequence_length=lm.max_position_embeddings,
        share_embeddings_and_output_weights=not lm.untie_embeddings_and_output_weights,
        position_embedding_type="rope",
        rotary_base=lm.rotary_base,
        pre_process=pre_process,
        post_process=post_process,
        vp_stage=vp_stage,
    )
    encoders, projectors = {}, {}
    for name, enc in (config.encoders.items() if pre_process else ()):
        encoders[name] = VisionTransformer(vision_transformer_config(enc, settings), enc,
                                           specs.vision_layer, specs.vision_norm)
        proj = config.projectors[name]
        projectors[name] = MultimodalProjector(
            projector_transformer_config(proj, lm, settings), specs.projector,
            proj.projector_type, input_size=enc.hidden_size)
    model = MultimodalModel(config, language_model, encoders, projectors, media_token_ids)
    model.freeze()
    return model
