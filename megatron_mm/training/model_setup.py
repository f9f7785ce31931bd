"""The run's model and optimizer: this rank's model chunks as the plan places them, wrapped
for DDP (and BF16), Megatron-Core's optimizer and LR scheduler, and the hooks Megatron-LM's
loop installs on the model config."""

from __future__ import annotations

import dataclasses
from typing import List

import torch
from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallelConfig, finalize_model_grads
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

from ..encoders import modalities_of
from ..models import MultimodalModel, build_model
from ..models.wrappers import DistributedDataParallel, Float16Module
from .build_settings import build_settings


def build_model_chunks(args, tokenizer, model_config, plan, replicas=None
                       ) -> List[MultimodalModel]:
    """This rank's pipeline chunks: one, or one per virtual stage (interleaved 1F1B), each
    holding the modules ``plan`` (a TrainingPlan) gives it."""
    settings = build_settings(args, plan.placements, replicas)
    pp, rank = args.pipeline_model_parallel_size, parallel_state.get_pipeline_model_parallel_rank()
    vpp = args.virtual_pipeline_model_parallel_size
    media_ids = {m: tokenizer.media_token_id(m)
                 for enc in model_config.encoders.values() for m in modalities_of(enc)}
    chunks = []
    for vp in range(vpp) if vpp else [None]:
        index = (vp or 0) * pp + rank
        chunk_settings = dataclasses.replace(
            settings, recompute_num_layers=plan.recompute_num_layers[index])
        chunks.append(build_model(model_config, chunk_settings, media_ids,
                                  placement=plan.placements[index], vp_stage=vp))
        if torch.cuda.is_available():  # as Megatron-LM's get_model: host-built modules too
            chunks[-1].cuda(torch.cuda.current_device())
    if replicas is not None:  # equal encoder replicas, each shard counted once in norms
        pieces = [p for chunk in chunks for p in chunk.encoder_piece_parameters()]
        replicas.sync_params(pieces)
        replicas.mark_duplicates(pieces)
    return chunks


def ddp_config(args) -> DistributedDataParallelConfig:
    """Megatron-LM's DDP settings for the run; ``--fp8-param-gather`` makes the distributed
    optimizer all-gather the FP8 parameters and requantise them after each step."""
    return DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=args.overlap_grad_reduce,
        use_distributed_optimizer=args.use_distributed_optimizer,
        fp8_param_gather=getattr(args, "fp8_param_gather", False))


def setup_model_and_optimizer(args, chunks: List[MultimodalModel], timers=None):
    """DDP-wrapped chunks, Megatron-Core's optimizer and LR scheduler; ``timers``
    (Megatron-Core's) go where the schedules and the optimizer read them."""
    config = chunks[0].config  # the one the schedules read their hooks from
    ddp = [DistributedDataParallel(config=chunk.config, ddp_config=ddp_config(args),
                                   module=Float16Module(chunk.config, chunk) if args.bf16
                                   else chunk)
           for chunk in chunks]
    optimizer = get_megatron_optimizer(OptimizerConfig(
        optimizer="adam", lr=args.lr, min_lr=args.min_lr, weight_decay=args.weight_decay,
        adam_beta1=args.adam_beta1, adam_beta2=args.adam_beta2, adam_eps=args.adam_eps,
        clip_grad=args.clip_grad, bf16=args.bf16, params_dtype=config.params_dtype,
        use_distributed_optimizer=args.use_distributed_optimizer,
        log_num_zeros_in_grad=getattr(args, "log_num_zeros_in_grad", False),
        barrier_with_L1_time=getattr(args, "barrier_with_L1_time", True), timers=timers),
        ddp)
    gbs = args.global_batch_size
    scheduler = OptimizerParamScheduler(
        optimizer, init_lr=args.lr_warmup_init, max_lr=args.lr, min_lr=args.min_lr,
        lr_warmup_steps=args.lr_warmup_iters * gbs, lr_decay_steps=args.lr_decay_iters * gbs,
        lr_decay_style=args.lr_decay_style, start_wd=args.weight_decay,
        end_wd=args.weight_decay, wd_incr_steps=args.train_iters * gbs,
        wd_incr_style="constant")
    # The hooks Megatron-LM's training loop installs on the model config.
    config.grad_scale_func = optimizer.scale_loss
    config.finalize_model_grads_func = finalize_model_grads
    config.timers = timers
    config.barrier_with_L1_time = getattr(args, "barrier_with_L1_time", True)
    if args.overlap_grad_reduce:
        no_sync = [chunk.no_sync for chunk in ddp]
        config.no_sync_func = no_sync[0] if len(no_sync) == 1 else no_sync
    return ddp, optimizer, scheduler
