"""How the model is built on this machine, from the flags: the transformer implementation,
the fusions whose kernels exist, the CP core attention, and the ``BuildSettings`` every
model chunk is built with."""

from __future__ import annotations

import torch

from ...models import BuildSettings
from ...models.fusions import Fusions, Kernels, choose_fusions
from ...models.attention_choice import choose_attention
from ...models.specs import (
    CPAttentionChoice, default_transformer_impl, require_transformer_engine,
    transformer_engine_importable)
from ..config.fusion_args import fusion_flags
from ..config.moe_args import refuse_uneven_expert_gathers


def distributed_backend(parallel) -> str:
    """``--distributed-backend``, or NCCL with CUDA, gloo without."""
    return parallel.distributed_backend or ("nccl" if torch.cuda.is_available() else "gloo")


def transformer_impl(model) -> str:
    """``--transformer-impl``, or this machine's default; Transformer Engine, asked for or
    defaulted to, must import, or its error stops the run (naming the flag)."""
    impl = model.transformer_impl or default_transformer_impl()
    if impl == "transformer_engine":
        require_transformer_engine(defaulted=model.transformer_impl is None)
    return impl


def fusions(config) -> Fusions:
    """Megatron-LM's fusions the flags (the RunConfig) leave on, where this machine has
    their kernels."""
    fp8 = config.fp8_settings
    return choose_fusions(fusion_flags(config.fusion), Kernels.probe(),
                          transformer_impl(config.model),
                          fp8_emulation=fp8 is not None and fp8.emulation)


def cp_attention_choice(config) -> CPAttentionChoice:
    """Which core attention the LLM runs (FlexAttention, or the CP attention under CP),
    from the flags (the RunConfig) and this machine."""
    parallel = config.parallel
    return choose_attention(
        config.model.attention_backend, parallel.context_parallel_size,
        transformer_impl(config.model), transformer_engine_importable(),
        torch.cuda.is_available(), media_attention=parallel.media_attention,
        packed=config.data.data_balance != "none",
        assignment=parallel.context_parallel_assignment, cp_comm_type=parallel.cp_comm_type,
        training=config.training.train_iters > 0,
        attention_dropout=config.model.attention_dropout,
        half_precision=config.training.bf16,
        lora=getattr(config.model_config, "lora", None) is not None)


def build_settings(config, placements=None, replicas=None) -> BuildSettings:
    """How every model chunk is built (``config``: the RunConfig); ``replicas``: the
    encoder replicas' groups (an encoder TP below the LLM's)."""
    model, parallel, recompute = config.model, config.parallel, config.recompute
    refuse_uneven_expert_gathers(config.moe, parallel, distributed_backend(parallel))
    impl = transformer_impl(model)
    cpu_init = model.use_cpu_initialization or not torch.cuda.is_available()
    cp = cp_attention_choice(config)
    return BuildSettings(
        cp_attention=cp.kind, cp_comm_type=cp.cp_comm_type,
        attention_backend=model.attention_backend,
        tensor_model_parallel_size=parallel.tensor_model_parallel_size,
        encoder_tensor_model_parallel_size=(replicas.tensor_model_parallel_size
                                            if replicas else None),
        encoder_tp_group=replicas.tp_group if replicas else None,
        encoder_data_parallel_group=replicas.data_parallel_group if replicas else None,
        pipeline_model_parallel_size=parallel.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=parallel.virtual_pipeline_model_parallel_size,
        context_parallel_size=parallel.context_parallel_size, transformer_impl=impl,
        expert_model_parallel_size=parallel.expert_model_parallel_size,
        expert_tensor_parallel_size=parallel.expert_tensor_parallel_size,
        bf16=config.training.bf16,
        hidden_dropout=model.hidden_dropout,
        sequence_parallel=parallel.sequence_parallel,
        attention_dropout=model.attention_dropout, init_method_std=model.init_method_std,
        use_cpu_initialization=cpu_init, placements=placements,
        recompute_granularity=recompute.recompute_granularity,
        recompute_method=recompute.recompute_method,
        recompute_num_layers=recompute.recompute_num_layers,
        media_attention=parallel.media_attention, fp8=config.fp8_settings,
        packed=config.data.data_balance != "none",
        fusions=fusions(config))
