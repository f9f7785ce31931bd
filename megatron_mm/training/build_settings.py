"""How the model is built on this machine, from the flags: the transformer implementation,
the fusions whose kernels exist, the CP core attention, and the ``BuildSettings`` every
model chunk is built with."""

from __future__ import annotations

import torch

from ..models import BuildSettings
from ..models.fusions import Fusions, Kernels, choose_fusions
from ..models.specs import (
    CPAttentionChoice, choose_cp_attention, default_transformer_impl,
    require_transformer_engine, transformer_engine_importable)
from .fusion_args import fusion_flags


def transformer_impl(args) -> str:
    """``--transformer-impl``, or this machine's default; Transformer Engine, asked for or
    defaulted to, must import, or its error stops the run (naming the flag)."""
    impl = args.transformer_impl or default_transformer_impl()
    if impl == "transformer_engine":
        require_transformer_engine(defaulted=args.transformer_impl is None)
    return impl


def fusions(args) -> Fusions:
    """Megatron-LM's fusions the flags leave on, where this machine has their kernels."""
    fp8 = getattr(args, "fp8_settings", None)
    return choose_fusions(fusion_flags(args), Kernels.probe(), transformer_impl(args),
                          fp8_emulation=fp8 is not None and fp8.emulation)


def cp_attention_choice(args) -> CPAttentionChoice:
    """Which CP core attention the LLM runs, from the flags and this machine."""
    return choose_cp_attention(
        args.context_parallel_size, transformer_impl(args),
        transformer_engine_importable(), torch.cuda.is_available(),
        media_attention=args.media_attention, packed=args.data_balance != "none",
        assignment=args.context_parallel_assignment, cp_comm_type=args.cp_comm_type)


def build_settings(args, placements=None, replicas=None) -> BuildSettings:
    """``replicas``: the encoder replicas' groups (an encoder TP below the LLM's)."""
    impl = transformer_impl(args)
    cpu_init = args.use_cpu_initialization or not torch.cuda.is_available()
    cp = cp_attention_choice(args)
    return BuildSettings(
        cp_attention=cp.kind, cp_comm_type=cp.cp_comm_type,
        tensor_model_parallel_size=args.tensor_model_parallel_size,
        encoder_tensor_model_parallel_size=(replicas.tensor_model_parallel_size
                                            if replicas else None),
        encoder_tp_group=replicas.tp_group if replicas else None,
        encoder_data_parallel_group=replicas.data_parallel_group if replicas else None,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=args.virtual_pipeline_model_parallel_size,
        context_parallel_size=args.context_parallel_size, transformer_impl=impl, bf16=args.bf16,
        hidden_dropout=args.hidden_dropout,
        sequence_parallel=getattr(args, "sequence_parallel", False),
        attention_dropout=args.attention_dropout, init_method_std=args.init_method_std,
        use_cpu_initialization=cpu_init, placements=placements,
        recompute_granularity=getattr(args, "recompute_granularity", None),
        recompute_method=getattr(args, "recompute_method", None),
        recompute_num_layers=getattr(args, "recompute_num_layers", None),
        media_attention=args.media_attention, fp8=getattr(args, "fp8_settings", None),
        fusions=fusions(args))
