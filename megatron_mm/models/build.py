"""Build a MultimodalModel from its config (inside an initialised Megatron-Core world)."""

from __future__ import annotations

import dataclasses

from typing import Mapping, Optional

import torch

from megatron.core.models.gpt import GPTModel
from megatron.core.models.vision.multimodal_projector import MultimodalProjector
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.enums import LayerType
from megatron.core.transformer.transformer_block import (
    TransformerBlockSubmodules,
    get_num_layers_to_build,
)
from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

from ..config import MultimodalModelConfig
from ..families import family_of
from ..families.model_spec import model_spec
from ..plan import Workload, build_chain
from ..plan.pipeline.placement import ChunkPlacement, whole_model
from .affine_projector import affine_projector_submodules
from .fp8_emulation import emulate_fp8
from .lora import apply_lora
from .linear_attention import hybrid_layers, require_fla
from .mrope_interleaved import InterleavedMultimodalRotaryEmbedding
from .multimodal import MultimodalModel
from .norms import SequenceParallelNorm
from .specs import LayerSpecs, get_layer_specs
from .transformer_configs import (
    BuildSettings,
    language_transformer_config,
    projector_transformer_config,
)

__all__ = ["BuildSettings", "build_language_model", "build_model", "layer_specs", "model_chain",
           "wrap_language_model"]


def build_model(config: MultimodalModelConfig, settings: BuildSettings,
                media_token_ids: Mapping[str, int],
                placement: Optional[ChunkPlacement] = None,
                vp_stage: Optional[int] = None) -> MultimodalModel:
    """The model, or the pipeline chunk ``placement`` describes (``vp_stage``: its virtual
    stage with interleaving). ``settings.placements`` holds every chunk's placement: the
    layer layout Megatron-Core builds each transformer stack from."""
    config.validate_parallel(settings.tensor_model_parallel_size,
                             settings.encoder_tensor_model_parallel_size)
    if placement is None:
        placement = whole_model_placement(config)
    specs = layer_specs(config, settings)
    language_model = build_language_model(config, settings, specs, placement, vp_stage)
    return wrap_language_model(config, settings, language_model, media_token_ids, placement,
                               vp_stage, specs)


def layer_specs(config: MultimodalModelConfig, settings: BuildSettings) -> LayerSpecs:
    """Every module's layer specs for this run (``get_layer_specs``)."""
    lm = config.language
    return get_layer_specs(settings.transformer_impl, qk_layernorm=lm.qk_layernorm,
                           context_parallel=settings.context_parallel_size > 1,
                           cp_attention=settings.cp_attention,
                           media_attention=settings.media_attention,
                           packed=settings.packed,
                           num_experts=lm.moe and lm.moe.num_experts,
                           moe_grouped_gemm=bool(lm.moe and lm.moe.grouped_gemm))


def build_language_model(config: MultimodalModelConfig, settings: BuildSettings,
                         specs: LayerSpecs, placement: ChunkPlacement,
                         vp_stage: Optional[int] = None) -> GPTModel:
    """The package's LLM (Llama-shaped: RMSNorm, SwiGLU, no linear biases) for the chunk
    ``placement`` describes."""
    lm = config.language
    if lm.linear_attention is not None:
        require_fla(torch.cuda.is_available())
    lm_config = language_transformer_config(lm, settings)
    if not (placement.llm_embed or placement.runs_llm
            or lm_config.pipeline_model_parallel_layout):
        # an encoder rank's chunk (--encoder-schedule separate): no LLM layer (a pipeline's
        # chunks without LLM layers have none by their layout)
        lm_config = dataclasses.replace(lm_config, num_layers=0)
    language_model = GPTModel(
        config=lm_config,
        transformer_layer_spec=language_block(specs, lm_config, vp_stage),
        vocab_size=lm.vocab_size_padded(settings.tensor_model_parallel_size),
        max_sequence_length=lm.max_position_embeddings,
        share_embeddings_and_output_weights=not lm.untie_embeddings_and_output_weights,
        position_embedding_type=lm.position_embedding_type,  # mrope: lm_config's section
        rotary_base=lm.rotary_base,
        rope_scaling=lm.rope_scaling,  # Llama 3.x's; YaRN's settings: lm_config's
        rope_scaling_factor=lm.rope_scaling_factor,
        rotary_percent=lm.rotary_percent,  # Qwen3.5: a quarter of each head rotates
        pre_process=placement.llm_embed,
        post_process=placement.llm_head,
        vp_stage=vp_stage,
        # The text embeddings stay whole until the media are merged in (as LLaVA's);
        # MultimodalModel shards them for the layers under --sequence-parallel.
        scatter_embedding_sequence_parallel=False,
    )
    if lm.mrope_interleaved:
        language_model.rotary_pos_emb = InterleavedMultimodalRotaryEmbedding(
            kv_channels=lm_config.kv_channels, rotary_percent=lm.rotary_percent,
            rotary_base=lm.rotary_base)
    return language_model


def wrap_language_model(config: MultimodalModelConfig, settings: BuildSettings,
                        language_model: GPTModel, media_token_ids: Mapping[str, int],
                        placement: Optional[ChunkPlacement] = None,
                        vp_stage: Optional[int] = None,
                        specs: Optional[LayerSpecs] = None) -> MultimodalModel:
    """``language_model`` (any Megatron-Core GPTModel of this chunk: the package's, or a
    user's own, built from their TransformerConfig and layer spec) with the encoders and
    projectors ``placement`` gives the chunk, built from their families: the chunk's
    MultimodalModel, frozen as the config says."""
    if placement is None:
        placement = whole_model_placement(config)
    if specs is None:
        specs = layer_specs(config, settings)
    lm = config.language
    encoders, projectors = {}, {}
    encoder_groups = encoder_process_groups(settings)
    for part in placement.encoders:
        enc = config.encoders[part.name]
        encoders[part.name] = family_of(enc).build_encoder(
            enc, settings, specs, part, part.name, vp_stage=vp_stage,
            pg_collection=encoder_groups, checkpoint_dp_group=settings.encoder_data_parallel_group)
        if part.projector:  # the family's own, else Megatron-Core's of --projector-type
            proj = config.projectors[part.name]
            own = family_of(enc).build_projector(enc, proj, lm, settings, specs, part.name)
            projectors[part.name] = own if own is not None else MultimodalProjector(
                projector_transformer_config(proj, lm, settings, part.name),
                affine_projector_submodules(specs.projector, proj.projector_type),
                proj.projector_type, input_size=enc.hidden_size)
    model = MultimodalModel(config, language_model, encoders, projectors, media_token_ids,
                            placement)
    model.freeze()
    if config.lora is not None:  # adapters; their modules' base weights frozen
        apply_lora(model, config.lora)
    if settings.fp8 is not None and settings.fp8.emulation:
        emulate_fp8(model)  # quantise-dequantise in the FP8 modules' local linears
    return model


def language_block(specs: LayerSpecs, config, vp_stage: Optional[int]):
    """The LLM's layer spec; with the local impl or MoE layers, as block submodules: one
    spec per layer of this chunk (an MoE LLM's dense and MoE layers by its
    ``moe_layer_freq`` pattern, at the layers' global numbers) and the final norm (the
    specs' own with the local impl: Megatron-Core's torch norm refuses sequence
    parallelism)."""
    hybrid = config.experimental_attention_variant == "gated_delta_net"
    if specs.impl != "local" and specs.language_moe_layer is None and not hybrid:
        return specs.language_layer
    layers = [specs.language_layer] * config.num_layers
    if hybrid:  # Gated DeltaNet layers where the pattern says 1 (linear_attention.py)
        layers = hybrid_layers(config.linear_attention_freq, specs.language_layer,
                               specs.language_moe_layer,
                               config.moe_layer_freq if config.num_moe_experts else None,
                               specs.impl)
    elif specs.language_moe_layer is not None:
        layers = [specs.language_moe_layer if sparse else specs.language_layer
                  for sparse in config.moe_layer_freq]
    return TransformerBlockSubmodules(
        layer_specs=[layers[i] for i in chunk_layer_ids(config, vp_stage)],
        layer_norm=SequenceParallelNorm if specs.impl == "local" else _te_norm())


def chunk_layer_ids(config, vp_stage: Optional[int]) -> list:
    """The global (0-based) numbers of the LLM layers this chunk builds, as Megatron-Core's
    ``get_gpt_decoder_block_spec`` slices them."""
    layout = config.pipeline_model_parallel_layout
    if layout is not None:
        return layout.get_layer_id_list(layer_type=LayerType.decoder, vp_stage=vp_stage)
    offset = get_transformer_layer_offset(config, vp_stage=vp_stage)
    return list(range(offset, offset + get_num_layers_to_build(config, vp_stage)))


def _te_norm():
    from megatron.core.extensions.transformer_engine import TENorm

    return TENorm


def encoder_process_groups(settings: BuildSettings) -> Optional[ProcessGroupCollection]:
    """Megatron-Core's groups with the encoder's own TP group (``settings.encoder_tp_group``,
    an encoder TP below the LLM's), or None: the default groups."""
    if settings.encoder_tp_group is None:
        return None
    if settings.context_parallel_size > 1:
        raise ValueError("an encoder TP group of its own needs context parallel size 1")
    groups = ProcessGroupCollection.use_mpu_process_groups()
    groups.tp = groups.tp_cp = settings.encoder_tp_group  # CP 1: TP x CP is TP
    return groups


def whole_model_placement(config: MultimodalModelConfig) -> ChunkPlacement:
    """Every module in one chunk (no pipeline parallelism)."""
    return whole_model(model_chain(config))


def model_chain(config: MultimodalModelConfig, seq_length: Optional[int] = None,
                micro_batch_size: int = 1, tensor_model_parallel_size: int = 1,
                expert_model_parallel_size: int = 1,
                expert_tensor_parallel_size: Optional[int] = None):
    """The planner's layer chain of this model (module names and per-layer costs)."""
    spec = model_spec(config)
    workload = Workload(seq_length=seq_length or max(config.language.seq_length,
                                                     spec.media_tokens_per_sample),
                        micro_batch_size=micro_batch_size,
                        tensor_model_parallel_size=tensor_model_parallel_size,
                        expert_model_parallel_size=expert_model_parallel_size,
                        expert_tensor_parallel_size=expert_tensor_parallel_size)
    return build_chain(spec, workload)
